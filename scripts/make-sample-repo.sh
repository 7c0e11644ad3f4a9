#!/usr/bin/env bash
# Create the sample repository `make demo` works on: "wordcount", a tiny stdlib-only
# Python web app (a page that counts the words of the text you post) with a unit test
# that fails until one line is fixed.
#
# Usage: make-sample-repo.sh DIR [--force]
#   DIR must not exist or be empty; --force deletes an existing DIR first.
#
# The bug: textstats.word_count() splits on " ", so newlines, tabs and runs of spaces
# miscount. The one-line fix, in wordcount/textstats.py:
#     -    words = [w for w in text.split(" ") if w]
#     +    words = text.split()
# Check with: python3 -m unittest -q   (in DIR; fails before the fix, passes after)
#
# Content, author and dates are fixed, so the commits (and HEAD's id, printed on the
# last line) are the same on every run with the same git.
set -euo pipefail

die() { echo "make-sample-repo: error: $*" >&2; exit 1; }

dir="" force=0
for arg in "$@"; do
    case "$arg" in
    --force) force=1 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) die "unknown option: $arg" ;;
    *) [ -z "$dir" ] || die "one DIR only"; dir="$arg" ;;
    esac
done
[ -n "$dir" ] || die "usage: make-sample-repo.sh DIR [--force]"
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    [ "$force" = 1 ] || die "$dir exists and is not empty (--force to replace it)"
    rm -rf -- "$dir"
fi
mkdir -p "$dir"
cd "$dir"

# A fixed identity and clock; no user or system git config leaks in.
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME="h5i sample" GIT_AUTHOR_EMAIL="sample@h5i.invalid"
export GIT_COMMITTER_NAME="h5i sample" GIT_COMMITTER_EMAIL="sample@h5i.invalid"
export TZ=UTC LC_ALL=C
umask 022

commit() {
    local when="$1" msg="$2"
    git add -A
    GIT_AUTHOR_DATE="$when +0000" GIT_COMMITTER_DATE="$when +0000" \
        git commit -q --no-verify -m "$msg"
}

git init -q -b main .
git config core.autocrlf false
git config commit.gpgsign false

mkdir -p wordcount tests

cat >README.md <<'EOF'
# wordcount

A tiny web app: paste text, get its word, line and character counts.

    python3 -m wordcount.server --port 8000   # then open http://127.0.0.1:8000/
    python3 -m unittest -q                    # the tests

Standard library only; Python 3.8 or newer.
EOF

cat >.gitignore <<'EOF'
__pycache__/
*.pyc
EOF

cat >wordcount/__init__.py <<'EOF'
"""wordcount: count the words, lines and characters of a text."""
EOF

cat >wordcount/textstats.py <<'EOF'
"""Text statistics. Pure functions, no I/O."""


def word_count(text):
    """Number of whitespace-separated words in text."""
    words = [w for w in text.split(" ") if w]
    return len(words)


def line_count(text):
    """Number of lines; a trailing newline does not start a new line."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def stats(text):
    """All the counts the page shows, as a dict."""
    return {
        "words": word_count(text),
        "lines": line_count(text),
        "chars": len(text),
    }
EOF

cat >wordcount/server.py <<'EOF'
"""The web app: GET / shows a form, POST / shows the counts of the posted text."""

import argparse
import html
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs

from wordcount.textstats import stats

PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>wordcount</title></head>
<body>
<h1>wordcount</h1>
<form method="post" action="/">
<textarea name="text" rows="8" cols="60">{text}</textarea><br>
<button type="submit">Count</button>
</form>
{result}
</body>
</html>
"""

RESULT = """<p id="result">words: <b id="words">{words}</b>,
lines: <b id="lines">{lines}</b>, characters: <b id="chars">{chars}</b></p>"""


def render(text=None):
    """The page, with the counts when text was posted."""
    result = "" if text is None else RESULT.format(**stats(text))
    return PAGE.format(text=html.escape(text or ""), result=result)


class Handler(BaseHTTPRequestHandler):
    def _send(self, body):
        data = body.encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(render())

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        form = parse_qs(self.rfile.read(length).decode("utf-8"))
        self._send(render(form.get("text", [""])[0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    server = HTTPServer((args.host, args.port), Handler)
    print(f"wordcount on http://{args.host}:{args.port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
EOF

cat >tests/__init__.py <<'EOF'
EOF

cat >tests/test_textstats.py <<'EOF'
import unittest

from wordcount.textstats import line_count, stats, word_count


class WordCountTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(word_count("hello brave new world"), 4)

    def test_empty(self):
        self.assertEqual(word_count(""), 0)
        self.assertEqual(word_count("   "), 0)

    def test_extra_spaces(self):
        self.assertEqual(word_count("  two   words "), 2)


class LineCountTest(unittest.TestCase):
    def test_lines(self):
        self.assertEqual(line_count(""), 0)
        self.assertEqual(line_count("one"), 1)
        self.assertEqual(line_count("one\ntwo\n"), 2)


class StatsTest(unittest.TestCase):
    def test_first_commit_only(self):
        self.assertEqual(stats("a b"), {"words": 2, "lines": 1, "chars": 3})
EOF

cat >tests/test_server.py <<'EOF'
import unittest

from wordcount.server import render


class RenderTest(unittest.TestCase):
    def test_form_only(self):
        page = render()
        self.assertIn("<form", page)
        self.assertNotIn('id="result"', page)

    def test_counts_and_escaping(self):
        page = render("<b>hi</b> there")
        self.assertIn('<b id="words">2</b>', page)
        self.assertIn("&lt;b&gt;hi&lt;/b&gt;", page)
EOF

commit "2025-01-06T09:00:00" "wordcount: a tiny web app that counts words, lines and characters"

# Second commit: a test for multi-line text, which the split(" ") bug fails.
cat >>tests/test_textstats.py <<'EOF'


class MultiLineTest(unittest.TestCase):
    def test_words_across_lines(self):
        text = "the quick brown fox\njumps over\tthe lazy dog\n"
        self.assertEqual(word_count(text), 9)
        self.assertEqual(stats(text), {"words": 9, "lines": 2, "chars": len(text)})
EOF
sed -i 's/def test_first_commit_only/def test_single_line/' tests/test_textstats.py
commit "2025-01-07T09:00:00" "tests: words across lines and tabs (fails: word_count splits on spaces only)"

git rev-parse HEAD
