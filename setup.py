"""keras-nmt-transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras 3.

The distribution is `keras-nmt-transformer` (`keras-transformer` on PyPI is an unrelated project
that installs a package of the same import name); the import package is `keras_transformer` and
the command `keras-transformer`. The version is written once, in keras_transformer/__init__.py.
"""

import posixpath
import re

from setuptools import find_packages, setup

DISTRIBUTION = "keras-nmt-transformer"
# The project's addresses, also in mkdocs.yml (site_url, repo_url) and CITATION.cff
# (tests/test_release.py checks that they agree).
REPOSITORY = "https://github.com/keras-transformer/keras-transformer"
DOCUMENTATION = "https://keras-transformer.github.io/keras-transformer/"

with open("keras_transformer/__init__.py", encoding="utf-8") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)


def absolute_target(target):
    """Where a README link points once the README is read without the repository beside it
    (a package index): a page of docs/ on the manual's site (`docs/guides/x.md#a` ->
    `DOCUMENTATION/guides/x/#a`, MkDocs' directory URLs), an image of docs/ there too, an anchor
    of the README on the repository's page, any other file of the repository on GitHub."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
        return target
    path, hashmark, anchor = target.partition("#")
    if not path:
        return f"{REPOSITORY}#{anchor}"
    path = posixpath.normpath(path.removeprefix("./"))
    if path == "docs" or path.startswith("docs/"):
        page = path.removeprefix("docs").lstrip("/")
        if page.endswith(".md"):
            page = re.sub(r"(^|/)index$", "", page.removesuffix(".md"))
            page = f"{page}/" if page else ""
        return f"{DOCUMENTATION}{page}{hashmark}{anchor}"
    return f"{REPOSITORY}/blob/main/{path}{hashmark}{anchor}"


def long_description(markdown):
    """The README with every relative link and image made absolute (`absolute_target`), outside
    fenced code blocks: a package index shows it without the repository beside it."""
    inline = re.compile(r"(!?\[(?:[^\]\[]|\[[^\]]*\])*\]\()([^)\s]+)")  # [text](target)
    definition = re.compile(r"^( {0,3}\[[^\]]+\]:[ \t]*)(\S+)", re.M)  # [label]: target
    parts = re.split(r"(^ {0,3}```.*?^ {0,3}```[^\n]*$)", markdown, flags=re.M | re.S)
    for i in range(0, len(parts), 2):  # the text between fenced blocks
        for pattern in (inline, definition):
            parts[i] = pattern.sub(lambda m: m.group(1) + absolute_target(m.group(2)), parts[i])
    return "".join(parts)


with open("README.md", encoding="utf-8") as f:
    LONG_DESCRIPTION = long_description(f.read())

setup(
    name=DISTRIBUTION,
    version=VERSION,
    description='The Transformer of "Attention Is All You Need" as TensorFlow/Keras 3 layers, '
    "training, beam search and a TF Serving SavedModel.",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    author="keras-transformer contributors",
    url=REPOSITORY,
    project_urls={
        "Documentation": DOCUMENTATION,
        "Source": REPOSITORY,
        "Changelog": f"{REPOSITORY}/blob/main/CHANGELOG.md",
        "Issues": f"{REPOSITORY}/issues",
    },
    license="Apache-2.0",
    license_files=["LICENSE"],
    # The configs the CLI and the README name (configs/*.yaml) ship inside the package:
    # `--config configs/quickstart.yaml` finds them where no checkout is beside the command.
    packages=[
        *find_packages(include=["keras_transformer", "keras_transformer.*"]),
        "keras_transformer.configs",
    ],
    package_dir={"keras_transformer.configs": "configs"},
    package_data={"keras_transformer.configs": ["*.yaml"]},
    # The supported range (docs/install.md#supported-versions), tested at both ends by .ci/run:
    # the oldest set (constraints/oldest.txt) and the newest this range allows.
    python_requires=">=3.10,<3.14",
    install_requires=[
        "tensorflow>=2.16.2,<2.22",
        "keras>=3.12,<3.16",
        "tensorflow-text>=2.16.1,<2.22",
        "tensorflow-datasets>=4.9,<5",
        "tensorboard>=2.16,<2.22",
        "sentencepiece>=0.2,<0.3",
        "sacrebleu>=2.4,<3",
        # TF Serving's PredictionLog protos: every export writes its warmup requests with them.
        "tensorflow-serving-api>=2.16.1,<2.22",
        "pyyaml>=6,<7",
        "numpy>=1.26,<3",
        # Attention heatmaps in TensorBoard.
        "matplotlib>=3.8,<4",
    ],
    extras_require={
        # `keras-transformer export --format ctranslate2` (imported only by that command).
        "ctranslate2": ["ctranslate2>=4.5,<5"],
        # Translation with a LiteRT export (`keras_transformer.litert`): the LiteRT interpreter,
        # without TensorFlow (`export --format litert` itself uses TensorFlow's converter);
        # flatbuffers (a dependency of ai-edge-litert) writes the shortlist's projection model.
        "litert": ["ai-edge-litert>=2.0,<3", "flatbuffers>=23"],
        # Training on Keras's JAX backend (`KERAS_BACKEND=jax keras-transformer train`); on NVIDIA
        # GPUs add `jax[cuda12]` (docs/guides/jax.md).
        "jax": ["jax>=0.4.30"],
        "test": [
            "pytest>=8",
            # Tests in parallel processes (the README test command runs two).
            "pytest-xdist>=3.5",
            # Property tests: random batches of mixed requests, random Unicode sources.
            "hypothesis>=6.100",
            # Line coverage in CI (.ci/run): `patch` (subprocesses, os._exit) needs coverage 7.10.
            "pytest-cov>=6",
            "coverage>=7.10",
            "jax[cpu]>=0.4.30",
            "ruff>=0.6",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6",
            # The CTranslate2 conversion tests run in CI too.
            "ctranslate2>=4.5,<5",
            # The LiteRT export's tests run its runtime.
            "ai-edge-litert>=2.0,<3",
            "flatbuffers>=23",
            # Our layers pass KerasHub's own layer test (its TestCase imports grain).
            "keras-hub>=0.32",
            "grain>=0.2",
            # The browser test of the results page drives the system's Chromium (.ci/run
            # installs Debian's `chromium`; Playwright's own browser download is not used).
            "playwright>=1.45",
        ],
        # The release check (.ci/release_check): build the wheel and sdist, check them.
        "release": ["build>=1", "twine>=5"],
        # The documentation site: `mkdocs build --strict` (CI) or `mkdocs serve`. MkDocs reads
        # the Markdown the guides are written in; mkdocstrings renders the API reference from
        # the docstrings by static analysis (griffe), without importing TensorFlow.
        "docs": [
            "mkdocs>=1.6,<2",
            "mkdocs-material>=9.5,<10",
            "mkdocstrings[python]>=0.26",
        ],
    },
    entry_points={"console_scripts": ["keras-transformer=keras_transformer.cli:main"]},
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Framework :: TensorFlow",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
