"""A class on one laptop: N students with their own keys, and one greedy student, for a fixed time.

Each student sends the lab's own request (the streamed chat of chat.py, with
chat_template_kwargs), thinks 2-5 s, and again. The greedy student loops without pause over
several connections. The same run is made with fair sharing on and off (--no-fair-share), one
after the other, and for each it prints: requests served, errors by kind, TTFT p50/p95/max overall
and for the greedy student against the others, aggregate tokens/s, Jain's fairness index of the
tokens each student received, and the server's RSS at start and end.

    python bench/bench_classroom.py [--students 30] [--duration 60] [-np 4] [--greedy-connections 4]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import MODEL_LOCK_PATH, Student, jain_index, kinetic_server, percentile, run_students, table  # noqa: E402


def key_file(students: int) -> tuple[Path, list[tuple[str, str]]]:
    """A key file as an instructor writes it: `KEY name`, one student a line."""
    entries = [(f"sk-student-{i:02d}", f"student{i:02d}") for i in range(students)] + [("sk-greedy", "greedy")]
    handle = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    handle.write("# kinetic class keys\n" + "".join(f"{key}  {name}\n" for key, name in entries))
    handle.close()
    return Path(handle.name), entries


def one_run(args: argparse.Namespace, fair: bool) -> list[object]:
    keys_path, entries = key_file(args.students)
    flags = ["-c", str(args.ctx), "-np", str(args.parallel), "-t", str(args.threads),
             "--api-key-file", str(keys_path), "--max-in-flight", str(args.greedy_connections)]
    if not fair:
        flags.append("--no-fair-share")
    students = [Student(name, key, (2.0, 5.0)) for key, name in entries if name != "greedy"]
    greedy = Student("greedy", "sk-greedy", (0.0, 0.0))
    with kinetic_server(args.model, flags) as server:
        rss_start = server.rss_mib()
        wall = run_students(server.url, students + [greedy], duration=args.duration, tokens=args.tokens,
                            connections=lambda s: args.greedy_connections if s is greedy else 1).wall
        rss_end = server.rss_mib()
    everyone = students + [greedy]
    results = [r for s in everyone for r in s.results]
    ok = [r for r in results if r.ok]
    errors = Counter(r.error for r in results if not r.ok)
    others_ttft = [r.ttft for s in students for r in s.results if r.ok]
    greedy_ttft = [r.ttft for r in greedy.results if r.ok]
    tokens_each = [float(sum(r.tokens for r in s.results if r.ok)) for s in everyone]
    return ["on" if fair else "off", len(ok), dict(errors) or "-",
            1000 * percentile([r.ttft for r in ok], 0.5), 1000 * percentile([r.ttft for r in ok], 0.95),
            1000 * max((r.ttft for r in ok), default=math.nan),
            1000 * percentile(others_ttft, 0.95), 1000 * percentile(greedy_ttft, 0.95),
            sum(1 for r in greedy.results if r.ok), sum(r.tokens for r in ok) / wall,
            jain_index(tokens_each), f"{rss_start:.0f} -> {rss_end:.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF (default: the bundled model)")
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("-c", "--ctx", type=int, default=8192)
    parser.add_argument("-np", "--parallel", type=int, default=4)
    parser.add_argument("-t", "--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--greedy-connections", type=int, default=4)
    parser.add_argument("--only", choices=["on", "off"], help="run one setting instead of both")
    args = parser.parse_args()
    if not args.model:
        from kinetic.backends.bundled import gemma_model_path

        args.model = str(gemma_model_path())
    from filelock import FileLock

    settings = [args.only == "on"] if args.only else [True, False]
    with FileLock(str(MODEL_LOCK_PATH)):
        rows = [one_run(args, fair) for fair in settings]
    print(f"{args.students} students (2-5 s think time) + 1 greedy student ({args.greedy_connections} connections), "
          f"{args.duration:.0f} s, -np {args.parallel}, {args.tokens} tokens a request")
    print(table(["fair share", "served", "errors", "TTFT p50 ms", "TTFT p95 ms", "TTFT max ms",
                 "others' p95 ms", "greedy's p95 ms", "greedy served", "aggregate tok/s", "Jain index",
                 "RSS MiB"], rows))


if __name__ == "__main__":
    main()
