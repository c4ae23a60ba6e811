"""transformer-zoo's Hydra sweepers (Hydra finds sweepers only in the ``hydra_plugins`` namespace
package; pyproject installs this folder with ``zoo``). Kept light: Hydra imports every plugin module
when it starts, so the work is imported only when a sweep runs."""
