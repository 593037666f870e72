"""MkDocs hook: the repository's CHANGELOG.md and CONTRIBUTING.md as pages of the site.

docs/changelog.md and docs/contributing.md each hold one line, `<!-- include: FILE -->`; this
hook (mkdocs.yml's `hooks`) puts FILE, read from the top of the repository, in its place. The
links of those files are written for GitHub, from the top of the repository: `docs/PAGE.md`
becomes `PAGE.md` (the including pages sit at the top of docs/, so `mkdocs build --strict`
checks them as any page's links), and a link to any other file of the repository goes to that
file on GitHub (`repo_url`). A page naming a missing file fails the build.
"""

import os
import re

INCLUDE = re.compile(r"^<!-- include: (?P<file>[\w.-]+) -->\s*$", re.M)
# An inline link's target that is a path of the repository: not a URL, not an anchor alone.
LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)(?P<path>[^)\s]+)\)")


def _site_link(match, repo_url):
    path = match.group("path")
    if path.startswith("docs/"):
        return f"]({path.removeprefix('docs/')})"
    return f"]({repo_url.rstrip('/')}/blob/main/{path})"


def on_page_markdown(markdown, page, config, files):
    def include(match):
        root = os.path.dirname(config.config_file_path)
        with open(os.path.join(root, match.group("file")), encoding="utf-8") as f:
            text = f.read()
        return LINK.sub(lambda link: _site_link(link, config.repo_url), text)

    return INCLUDE.sub(include, markdown)
