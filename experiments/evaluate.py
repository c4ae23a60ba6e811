"""Evaluate a checkpoint on a split with the task metric (bpc / ppl / accuracy).

Usage and options: ``python experiments/evaluate.py --help``; its command line: zoo/app/commands/evaluate.py."""

from zoo.app.commands.evaluate import command, main  # noqa: F401  (main(argv): the same command, in process)

if __name__ == "__main__":
    command()
