"""Export a checkpoint as a folder (weights, config, model card) that zoo.from_pretrained loads.

Usage and options: ``python experiments/export.py --help``; its command line: zoo/app/commands/export.py."""

from zoo.app.commands.export import command, main  # noqa: F401  (main(argv): the same command, in process)

if __name__ == "__main__":
    command()
