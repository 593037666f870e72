"""What a release carries for a stranger: the license, the metadata a package index shows (with a
README whose links work there), the citation, the install page's extras and CHANGELOG's links.
setup.py is run with `setuptools.setup` replaced by a recorder: seconds, no build (the built
wheel and sdist are checked by .ci/release_check)."""

import os
import re
import runpy

import pytest
import setuptools
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def setup_py():
    """`(kwargs, namespace)`: what setup.py passes to `setup()`, and its module globals."""
    captured = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
        patch.chdir(ROOT)
        namespace = runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="__main__")
    return captured, namespace


def test_the_license_is_apache_2_and_the_metadata_says_so(setup_py):
    kwargs, _ = setup_py
    text = _read("LICENSE")
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert kwargs["license"] == "Apache-2.0"
    assert kwargs["license_files"] == ["LICENSE"]
    classifiers = kwargs["classifiers"]
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    for classifier in (
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: OS Independent",
    ):
        assert classifier in classifiers


def test_python_classifiers_are_the_supported_range(setup_py):
    kwargs, _ = setup_py
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", kwargs["python_requires"]).groups()
    listed = {c.rsplit(" ", 1)[1] for c in kwargs["classifiers"] if re.search(r"3\.\d+$", c)}
    assert listed == {f"3.{minor}" for minor in range(int(low), int(high))}


def test_project_addresses_agree_everywhere(setup_py):
    """setup.py's addresses are mkdocs.yml's site and repository and CITATION.cff's."""
    kwargs, namespace = setup_py
    repository, documentation = namespace["REPOSITORY"], namespace["DOCUMENTATION"]
    assert kwargs["url"] == repository and kwargs["author"] == "keras-transformer contributors"
    urls = kwargs["project_urls"]
    assert set(urls) == {"Documentation", "Source", "Changelog", "Issues"}
    assert urls["Documentation"] == documentation and urls["Source"] == repository
    assert all(url.startswith(repository) for key, url in urls.items() if key != "Documentation")
    mkdocs = yaml.safe_load(_read("mkdocs.yml"))
    assert mkdocs["site_url"] == documentation and mkdocs["repo_url"] == repository
    citation = yaml.safe_load(_read("CITATION.cff"))
    assert citation["repository-code"] == repository and citation["url"] == documentation
    assert citation["license"] == kwargs["license"]


def test_citation_cites_the_software_and_the_paper():
    citation = yaml.safe_load(_read("CITATION.cff"))
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software"
    assert citation["authors"] == [{"name": "keras-transformer contributors"}]
    (paper,) = citation["references"]
    assert paper["title"] == "Attention Is All You Need" and paper["year"] == 2017
    assert paper["authors"][0]["family-names"] == "Vaswani" and len(paper["authors"]) == 8


def _links(markdown):
    """Every link and image target of `markdown` outside fenced code blocks: inline
    `[text](target)` (the text may span lines), `[label]: target` and HTML `src=`/`href=`."""
    prose = re.sub(r"^ {0,3}```.*?^ {0,3}```", "", markdown, flags=re.M | re.S)
    return (
        re.findall(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)", prose)
        + re.findall(r"^ {0,3}\[[^\]]+\]:[ \t]*(\S+)", prose, re.M)
        + re.findall(r"""(?:src|href)=["']([^"']+)""", prose)
    )


def test_long_description_has_no_relative_link(setup_py):
    """A package index shows the README without the repository beside it: each `docs/` link
    becomes the manual's page, each other link the repository's, and every page exists."""
    kwargs, namespace = setup_py
    documentation = namespace["DOCUMENTATION"]
    assert kwargs["long_description_content_type"] == "text/markdown"
    readme_links, links = _links(_read("README.md")), _links(kwargs["long_description"])
    assert len(links) == len(readme_links) > 20
    assert any(not re.match(r"https?://", link) for link in readme_links)  # something to rewrite
    relative = [link for link in links if not re.match(r"https?://", link)]
    assert not relative, relative
    for link in links:
        if link.startswith(documentation):
            page = link[len(documentation) :].split("#")[0]
            candidates = [f"docs/{page}index.md", f"docs/{page.rstrip('/')}.md", f"docs/{page}"]
            assert any(os.path.isfile(os.path.join(ROOT, c)) for c in candidates), link


def test_readme_targets_map_to_the_manual_and_the_repository(setup_py):
    _, namespace = setup_py
    target, site, repo = (namespace[k] for k in ("absolute_target", "DOCUMENTATION", "REPOSITORY"))
    assert target("docs/guides/jax.md#on-a-gpu") == f"{site}guides/jax/#on-a-gpu"
    assert target("docs/index.md") == site
    assert target("docs/reference/index.md") == f"{site}reference/"
    assert target("docs/img/a.png") == f"{site}img/a.png"
    assert target("./docs/results.md#x-1") == f"{site}results/#x-1"
    assert target("#results") == f"{repo}#results"
    assert target("CONTRIBUTING.md") == f"{repo}/blob/main/CONTRIBUTING.md"
    assert target("https://arxiv.org/abs/1706.03762") == "https://arxiv.org/abs/1706.03762"


def test_dependencies_have_upper_bounds_and_the_jax_extra(setup_py):
    kwargs, _ = setup_py
    unbounded = [r for r in kwargs["install_requires"] if "<" not in r]
    assert not unbounded, unbounded  # a new major version may break the package
    assert kwargs["extras_require"]["jax"] == ["jax>=0.4.30"]


def test_install_page_lists_every_extra(setup_py):
    kwargs, _ = setup_py
    page = _read("docs/install.md")
    for extra in kwargs["extras_require"]:
        assert re.search(rf"^\| `{extra}` \|", page, re.M), extra
    assert "docs/install.md" in _read("setup.py")  # the comment on the supported range
    assert 'pip install "keras-nmt-transformer[jax]"' in _read("docs/guides/jax.md")
    assert 'pip install "jax[cuda12]"' in _read("docs/guides/jax.md")


def test_changelog_versions_have_link_references(setup_py):
    """Each `## [VERSION]` heading of CHANGELOG.md is a link (Keep a Changelog): `[Unreleased]`
    compares the newest tag with HEAD, each version links its tag `vVERSION`; the version being
    built has its heading."""
    _, namespace = setup_py
    repository = namespace["REPOSITORY"]
    text = _read("CHANGELOG.md")
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    references = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", text, re.M))
    assert headings[0] == "Unreleased" and len(headings) > 2
    versions = headings[1:]
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in versions), versions
    assert set(references) == set(headings), set(references) ^ set(headings)
    assert references["Unreleased"] == f"{repository}/compare/v{versions[0]}...HEAD"
    for version in versions:
        assert references[version] == f"{repository}/releases/tag/v{version}", version
    assert namespace["VERSION"] in versions  # a version bump comes with its CHANGELOG section
