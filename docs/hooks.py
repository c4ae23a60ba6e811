"""MkDocs hook: links from the documentation to files of the repository outside ``docs/``.

Pages link to results, configs and code by repository-absolute paths (``[x](/results/demo/README.md)``),
which GitHub resolves from the repository root and MkDocs cannot follow (they are not pages). MkDocs
reports absolute links only at ``info`` level (``validation.absolute_links`` in mkdocs.yml), so this hook
checks them itself: a link to a path that does not exist fails the build, strict or not.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

REPO_ROOT = Path(__file__).resolve().parents[1]
# [text](/path) or [text](/path#anchor): the path part, without the anchor
REPO_LINK = re.compile(r"\]\((/[^)#\s]+)(?:#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page, config, files) -> str:
    missing = [link for link in REPO_LINK.findall(markdown) if not (REPO_ROOT / link.lstrip("/")).exists()]
    if missing:
        raise PluginError(f"{page.file.src_path}: links to missing repository files: {', '.join(missing)}")
    return markdown
