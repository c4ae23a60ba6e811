"""Regenerate conf/ (a YAML per registered part, task, preset and study) and the README's
mechanism x position-scheme table from the registries.

Usage and options: ``python experiments/sync_configs.py --help``; its command line: zoo/app/commands/sync_configs.py."""

from zoo.app.commands.sync_configs import command, main  # noqa: F401  (main(argv): the same command, in process)

if __name__ == "__main__":
    command()
