"""Lab 04-05 (images and the projector): what `kinetic grade lab-04-05` checks, and for how many points.

see.py prints, for one image, an `[image NAME: SIZE KB, sha256 HASH]` line, then three requests with
the same question (text only, with the image, with the image again), each as a usage line and a
server line:

    [image: finish_reason=length prompt=34 tok, completion=32 tok, 0.8s]
    [server: cache_n=11 prompt_n=23 prompt 372.0 t/s, generazione 46.4 t/s]

The outputs are found by these shapes anywhere in the file; only the answer is found by its heading.

Usage and timings count the same tokens, an image's embeddings included: cache_n + prompt_n is the
prompt's tokens, also on an M-RoPE model (Qwen3.5), whose image takes fewer positions in the cache than it
has embeddings.

- the file alone: both images' runs are there, the numbers of each run agree, the image adds tokens to
  the prompt, the repeated image comes from the cache, a new image does not;
- `--ledger`: an image-bearing request of this student whose usage counts the image's tokens, and every
  pasted run one of their requests, number for number, with an image exactly where see.py sent one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from kinetic.grading import Context, Failure, Fingerprint, Lab, Skip
from kinetic.grading.deliverable import Deliverable
from kinetic.grading.ledger_view import Record, author_ledger, describe_record, printed_alike, timing
from kinetic.grading.usage_lines import CHAT_ROUTES, NUM, WALL_FACTOR, WALL_MARGIN_S

lab = Lab("lab-04-05", "Images and the projector", deliverable_min_outputs=2, copy_weight=3, copy_points=1)

MAX_TOKENS = 32  # see.py's max_tokens; tests/e2e/test_lab_04_05.py keeps them equal
LAB_PICTURE = "picture.png"  # the lab's own image: every student sends the same bytes
LABELS = ("text only", "image", "image again")  # see.py's three requests, in order
# On an exact repeat the server computes only the prompt's last position again (llama-server's rule), or, on
# a hybrid model, from the checkpoint saved 4 tokens before the prompt's end: a handful, never the image.
REPEAT_MAX_PROMPT_N = 8
IMAGE_RE = re.compile(r"\[image (.+?): ([\d.]+) KB, sha256 ([0-9a-f]{12})\]")
RUN_RE = re.compile(rf"\[(text only|image again|image): finish_reason=(\w+) prompt=(\d+) tok, "
                    rf"completion=(\d+) tok, {NUM}s\]")
SERVER_RE = re.compile(rf"\[server: cache_n=(\d+) prompt_n=(\d+) prompt {NUM} t/s, "
                       rf"(?:generazione|generation) {NUM} t/s\]")
ANSWER_HEADING = re.compile(r"answer|risposta|question|domanda|cost|costa", re.I)
OUTPUT_HEADING = re.compile(r"see\.py|output", re.I)
ANSWER_TERMS = {
    "the cache": re.compile(r"cach|kv", re.I),
    "tokens": re.compile(r"token", re.I),
}


@dataclass(frozen=True)
class Run:
    """One request as see.py printed it."""

    label: str
    finish_reason: str
    prompt: int
    completion: int
    seconds: float
    cache_n: int
    prompt_n: int
    prompt_tps: float
    generation_tps: float
    usage_line: str
    server_line: str


@dataclass
class Invocation:
    """One `python see.py [IMAGE]`: its image line and the runs printed after it."""

    name: str
    sha: str
    line: str
    runs: dict[str, Run] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(label in self.runs for label in LABELS)


@dataclass
class Outputs:
    invocations: list[Invocation]
    stray: list[str]  # a run line without its server line, or one before any image line
    answer: list[str] | None


def parse_outputs(deliverable: Deliverable) -> Outputs:
    invocations: list[Invocation] = []
    stray: list[str] = []
    pending: re.Match[str] | None = None
    for line in deliverable.lines:
        if (image := IMAGE_RE.search(line)) is not None:
            invocations.append(Invocation(image[1], image[3], image[0]))
        elif (usage := RUN_RE.search(line)) is not None:
            if pending is not None:
                stray.append(pending[0])
            pending = usage
        elif (server := SERVER_RE.search(line)) is not None and pending is not None:
            if not invocations:
                stray.append(pending[0])
            else:
                run = Run(pending[1], pending[2], int(pending[3]), int(pending[4]), float(pending[5]),
                          int(server[1]), int(server[2]), float(server[3]), float(server[4]), pending[0], server[0])
                invocations[-1].runs.setdefault(run.label, run)
            pending = None
    if pending is not None:
        stray.append(pending[0])
    answers = [s for s in deliverable.sections if ANSWER_HEADING.search(s.heading)
               and not OUTPUT_HEADING.search(s.heading)]
    return Outputs(invocations, stray, answers[-1].prose if answers else None)


def outputs(ctx: Context) -> Outputs:
    return ctx.parsed("outputs", lambda: parse_outputs(ctx.deliverable))


def lab_picture_sha(lab_dir: Path) -> str:
    """The first digits of picture.png's sha256, as see.py prints them."""
    return hashlib.sha256((lab_dir / LAB_PICTURE).read_bytes()).hexdigest()[:12]


@lab.outputs_found
def count_outputs(deliverable: Deliverable) -> int:
    found = parse_outputs(deliverable)
    return sum(1 for i in found.invocations if i.runs) + bool(found.answer)


@lab.fingerprints
def fingerprints(ctx: Context) -> list[Fingerprint]:
    prints = []
    picture = lab_picture_sha(ctx.lab_dir)
    for invocation in outputs(ctx).invocations:
        if invocation.sha != picture:  # a photo of one's own; the lab's picture is everyone's
            prints.append(Fingerprint("your image's sha256", invocation.sha, 2))
        # the usage lines are left out: on one server every student's are alike but for the seconds
        prints += [Fingerprint(f"the [server: ...] line of '{run.label}' on {invocation.name}",
                               f"{run.cache_n} {run.prompt_n} {run.prompt_tps} {run.generation_tps}", 2)
                   for run in invocation.runs.values()]
    return prints


def _invocations(ctx: Context) -> list[Invocation]:
    complete = [i for i in outputs(ctx).invocations if i.complete]
    if not complete:
        raise Skip("no complete output of see.py (see outputs_present)")
    return complete


def _own_image(ctx: Context) -> Invocation:
    picture = lab_picture_sha(ctx.lab_dir)
    own = [i for i in _invocations(ctx) if i.sha != picture]
    if not own:
        raise Skip("no run of see.py on an image of your own (see outputs_present)")
    return own[0]


# ---------------------------------------------------------------------------------------------
# The file alone

@lab.check(points=2)
def outputs_present(ctx: Context) -> None:
    """lab-04-05.md holds the whole output of see.py on the lab's picture.png and on an image of your own
    (the image line and the text only, image and image again runs, each with its server line) and the answer."""
    found = outputs(ctx)
    picture = lab_picture_sha(ctx.lab_dir)
    missing = []
    if found.stray:
        missing.append(f"the [server: cache_n=... prompt_n=...] line after {found.stray[0]}")
    for invocation in found.invocations:
        if not invocation.complete:
            absent = ", ".join(f"'{label}'" for label in LABELS if label not in invocation.runs)
            missing.append(f"the {absent} run of see.py on {invocation.name}")
    complete = [i for i in found.invocations if i.complete]
    if not any(i.sha == picture for i in complete):
        missing.append(f"the output of python see.py on the lab's {LAB_PICTURE} (sha256 {picture})")
    if not any(i.sha != picture for i in complete):
        missing.append("the output of python see.py on an image of your own (another file than picture.png)")
    if not found.answer:
        missing.append("the answer (under a heading such as 'Answer' or 'Risposta')")
    if missing:
        raise Failure("missing: " + "; ".join(missing),
                      "paste each whole output as see.py printed it, from its [image ...] line on; "
                      "start from the lab-04-05.md template")


def _run_problem(run: Run) -> str | None:
    if run.cache_n + run.prompt_n != run.prompt:
        return (f"cache_n={run.cache_n} + prompt_n={run.prompt_n} is not the prompt's {run.prompt} tokens: "
                "every prompt token is either reused or computed")
    if run.prompt_n < 1:
        return "prompt_n=0: the server computes at least the prompt's last position"
    if not 1 <= run.completion <= MAX_TOKENS or run.generation_tps <= 0:
        return f"completion={run.completion} tok at {run.generation_tps} t/s: see.py asks for 1 to {MAX_TOKENS} tokens"
    if run.finish_reason == "length" and run.completion != MAX_TOKENS:
        return f"finish_reason=length after {run.completion} tokens, but see.py stops at {MAX_TOKENS}"
    # speeds printed to 0.1: moved by 0.05 either way; the fastest reading leaves the first token out
    fastest = run.prompt_n / (run.prompt_tps + 0.05) + (run.completion - 1) / (run.generation_tps + 0.05)
    if fastest > run.seconds + 0.1:
        return (f"at the speeds you report the server needs at least {fastest:.1f}s, "
                f"but the whole request took {run.seconds}s")
    slowest = run.prompt_n / max(run.prompt_tps - 0.05, 1e-3) + run.completion / max(run.generation_tps - 0.05, 1e-3)
    if run.seconds > WALL_FACTOR * slowest + WALL_MARGIN_S:
        return f"the request took {run.seconds}s but the server's speeds account for only {slowest:.1f}s"
    return None


@lab.check()
def run_numbers_agree(ctx: Context) -> None:
    """the numbers of each run agree with each other: cache_n + prompt_n is the prompt, the answer within
    see.py's max_tokens, the time the server's speeds imply within see.py's own clock."""
    for invocation in _invocations(ctx):
        for run in invocation.runs.values():
            problem = _run_problem(run)
            if problem:
                raise Failure(f"'{run.label}' on {invocation.name}: {problem}",
                              "copy the usage and server lines of one run without editing the numbers")


@lab.check()
def image_adds_tokens(ctx: Context) -> str:
    """the image is part of the prompt: the image runs count more prompt tokens than the text only run,
    the same number both times."""
    notes = []
    for invocation in _invocations(ctx):
        text, image, again = (invocation.runs[label] for label in LABELS)
        if image.prompt <= text.prompt:
            raise Failure(f"on {invocation.name} the image run counts {image.prompt} prompt tokens and the text only "
                          f"run {text.prompt}: the image added nothing",
                          "start the server with a projector (-mm, or -hf a repo with an mmproj file) and run see.py")
        if again.prompt != image.prompt:
            raise Failure(f"on {invocation.name} the same request counts {image.prompt} then {again.prompt} prompt "
                          "tokens", "paste the three runs of one python see.py, unedited")
        notes.append(f"{invocation.name}: {image.prompt - text.prompt} tokens with its markers")
    return "; ".join(notes)


@lab.check(points=2)
def repeat_comes_from_cache(ctx: Context) -> str:
    """the image sent again comes from the server's cache: cache_n is the prompt but for its last few tokens."""
    notes = []
    for invocation in _invocations(ctx):
        again = invocation.runs["image again"]
        if again.prompt_n > REPEAT_MAX_PROMPT_N:
            raise Failure(f"on {invocation.name} the image again run computed prompt_n={again.prompt_n} of its "
                          f"{again.prompt} prompt tokens: a repeated image is reused, at most {REPEAT_MAX_PROMPT_N} "
                          "tokens are computed again",
                          "run see.py against a server with the prompt cache on (the default)")
        notes.append(f"{invocation.name}: cache_n={again.cache_n} of {again.prompt}")
    return "; ".join(notes)


@lab.check()
def new_image_is_computed(ctx: Context) -> str:
    """your own image is new to the server: its first run reuses no more than the text before the image."""
    own = _own_image(ctx)
    text, image = own.runs["text only"], own.runs["image"]
    # what precedes the image is part of the text only prompt, so a cache that stops before the image
    # reuses fewer tokens than that prompt has
    if image.cache_n >= text.prompt:
        raise Failure(f"the first image run on {own.name} reused cache_n={image.cache_n} tokens, more than the "
                      f"{text.prompt} of the text only prompt: the server had this image already",
                      "paste the first python see.py on an image the server has not seen before")
    return f"{own.name}: cache_n={image.cache_n}, prompt_n={image.prompt_n} computed"


@lab.check()
def answer_explains_cost(ctx: Context) -> None:
    """your answer says what a repeated image and a new one cost, in tokens and through the cache."""
    answer = outputs(ctx).answer
    if not answer:
        raise Skip("no answer section (see outputs_present)")
    text = "\n".join(answer)
    missing = [term for term, pattern in ANSWER_TERMS.items() if not pattern.search(text)]
    if missing:
        raise Failure(f"the answer does not mention {' or '.join(missing)}",
                      "say how many prompt tokens the image took, and what the cache (cache_n) did with it "
                      "the second time and with a new image")


# ---------------------------------------------------------------------------------------------
# Against the class server's ledger

def _served(run: Run, record: Record) -> bool:
    """The ledger record is a chat request that got these very numbers, with an image where see.py sent one."""
    media = record.media
    with_image = run.label != "text only"
    return (record.route in CHAT_ROUTES and record.status == 200 and not record.stream
            and record.prompt_tokens == run.prompt and record.completion_tokens == run.completion
            and record.finish_reason == run.finish_reason and timing(record, "cache_n") == run.cache_n
            and timing(record, "prompt_n") == run.prompt_n
            and printed_alike(timing(record, "prompt_per_second"), run.prompt_tps)
            and printed_alike(timing(record, "predicted_per_second"), run.generation_tps)
            and (media is not None and media.images == 1) == with_image
            and record.duration_s <= run.seconds + 0.05)


@lab.check(points=2, needs="ledger")
def image_request_in_ledger(ctx: Context) -> str:
    """the ledger holds a request of yours that carried an image, and its usage counts the image's tokens."""
    ledger = author_ledger(ctx.ledger)
    with_media = [(r, media) for r in ledger.mine if r.status == 200
                  and (media := r.media) is not None and media.images]
    if not with_media:
        raise Failure(f"no request of {ledger.name} with an image in the ledger",
                      "run python see.py against the class server with your key")
    for record, media in with_media:
        if (record.prompt_tokens or 0) >= media.tokens + 1:
            return (f"{describe_record(record)}: prompt_tokens={record.prompt_tokens}, "
                    f"the image {media.tokens} of them")
    record, media = with_media[0]
    raise Failure(f"{describe_record(record)} read an image of {media.tokens} tokens but counts "
                  f"prompt_tokens={record.prompt_tokens}: its usage leaves the image out",
                  "tell the instructor: the server's usage should count the image's tokens")


@lab.check(points=2, needs="ledger")
def runs_in_ledger(ctx: Context) -> str:
    """each pasted run is one of your requests, number for number, with an image where see.py sent one,
    and it took the server no longer than see.py's own clock says."""
    ledger = author_ledger(ctx.ledger)
    runs = [run for invocation in _invocations(ctx) for run in invocation.runs.values()]
    return ledger.match_each(runs, _served, lambda run: f"request of {ledger.name} matches {run.usage_line} "
                             f"{run.server_line}",
                             "run python see.py yourself, with your key, and paste its output unedited")
