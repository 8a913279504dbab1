"""README.md is the landing page: short enough to read in two minutes, with the console's words explained where a
user first meets them, and every doc it links present."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GLOSSARY = ("target", "k", "block, full block", "tau", "acceptance per position", "lossless", "speedup",
            "quarantined", "held-out")


def test_readme_is_a_landing_page_under_10_kb():
    size = len(README.read_bytes())
    assert size < 10 * 1024, f"README.md is {size} bytes: move history to docs/measurements.md"


def test_glossary_explains_the_consoles_words_before_the_cluster_path():
    text = README.read_text()
    rows = dict(re.findall(r"^\| ([a-z, -]+) \| (.+) \|$", text, flags=re.M))
    assert all(rows.get(word) for word in GLOSSARY), sorted(set(GLOSSARY) - set(rows))
    assert text.index("| tau |") < text.index("## On a cluster")


def test_every_local_link_resolves():
    text = README.read_text()
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", text) if not link.startswith("http")]
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, missing
