"""What a configuration builds, without data or training, beside its paper's figures.

Usage and options: ``python experiments/describe.py --help``; its command line: zoo/app/commands/describe.py."""

from zoo.app.commands.describe import command, main  # noqa: F401  (main(argv): the same command, in process)

if __name__ == "__main__":
    command()
