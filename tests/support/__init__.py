"""What several test files share: the app run as a user runs it (app_cli), override lists (app_overrides),
experiment scripts loaded as modules (script_modules), and a sweep killed mid-run (sweep_killer)."""
