"""`make demo`: every LM preset that fits, tiny, on multi-query associative recall in one Hydra multirun, ending
with the comparison table and the path of its plot.

Usage and options: ``python experiments/demo.py --help``; its command line: zoo/app/commands/demo.py."""

from zoo.app.commands.demo import command, main  # noqa: F401  (main(argv): the same command, in process)

if __name__ == "__main__":
    command()
