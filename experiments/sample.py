"""Generate from a language-model checkpoint: text, or for image tasks a PNG grid of samples and completions.

Usage and options: ``python experiments/sample.py --help``; its command line: zoo/app/commands/sample.py."""

from zoo.app.commands.sample import command, main  # noqa: F401  (main(argv): the same command, in process)

if __name__ == "__main__":
    command()
