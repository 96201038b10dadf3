"""Timing you can trust: methods run interleaved and repeated, every number a median with its spread.

One timing of one run says little on a shared machine: a browser drawing a page, another process,
a descheduled thread can double a run's wall time. So every place that shows a speed-up (the
bench, the dashboard's Compare, the race, the notebooks) times the same way:

    order       ar, m1, m2, ar, m1, m2, ... for R repeats (`interleave`): machine noise falls on
                every method alike, and each repeat holds one run of every method
    a cell      the median of its R wall times with the spread min..max (`Cell`)
    speed-up    per repeat r: ar's wall time in r / the method's in r; reported as the median of
                these R ratios with their min..max (`speedup`), so a slow moment that hit one
                repeat moves one ratio, not the result
    verdict     reliable, or unreliable with the reason (`verdict`):
                  "the spread crosses 1.0"          the method was both faster and slower than ar
                  "the runs disagree by more than 10%"   a ratio lies over 10% from the median
                  "the machine was busy"            other processes took over 25% of the CPUs
                                                    during the runs (`CpuMeter`, from /proc/stat)
                  "one run: no spread to judge"     R = 1
                the 10% and the 25% are `Thresholds` (`speclab bench --max-disagree --max-busy`)

The statistics and the verdict are pure functions of numbers (tested on given numbers);
`interleave` runs the callables and meters the machine.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

MAX_DISAGREE = 0.10     # a ratio further than this share from the median makes the speed-up unreliable
MAX_BUSY = 0.25         # other processes' share of all CPUs during the runs above which the machine was busy


@dataclass(frozen=True)
class Thresholds:
    """Where the verdict turns unreliable: a per-repeat ratio further than max_disagree (a share)
    from their median, or other processes using over max_busy of all CPUs during the runs."""
    max_disagree: float = MAX_DISAGREE
    max_busy: float = MAX_BUSY

    def __post_init__(self):
        if not 0 < self.max_disagree:
            raise ValueError(f"max_disagree {self.max_disagree}: give a share above 0, e.g. 0.10 for 10%")
        if not 0 <= self.max_busy <= 1:
            raise ValueError(f"max_busy {self.max_busy}: give a share of the CPUs from 0 to 1, e.g. 0.25 for 25%")

    def text(self) -> str:
        return (f"unreliable where a repeat's ratio lies over {self.max_disagree:.0%} from the median or other "
                f"processes used over {self.max_busy:.0%} of the CPUs")


@dataclass
class Cell:
    """R measurements of one quantity: the median and the spread (min, max; quartiles q1, q3)."""
    values: list[float]
    median: float
    lo: float
    hi: float
    q1: float
    q3: float

    @property
    def n(self) -> int:
        return len(self.values)

    def text(self, fmt: str = "{:.3f}", unit: str = "") -> str:
        """'0.185 s (0.181-0.203)' style: the median, then the spread when there is one."""
        m = fmt.format(self.median) + unit
        return m if self.n < 2 else f"{m} ({fmt.format(self.lo)}-{fmt.format(self.hi)})"


def cell(values) -> Cell:
    """The median and spread of a non-empty list of numbers."""
    v = [float(x) for x in values]
    if not v:
        raise ValueError("no measurements: a cell needs at least one run")
    s = sorted(v)
    q1, q3 = (statistics.quantiles(s, n=4, method="inclusive")[::2] if len(s) > 1 else (s[0], s[0]))
    return Cell(v, statistics.median(s), s[0], s[-1], q1, q3)


@dataclass
class SpeedUp:
    """A method's speed-up over the baseline from R paired repeats."""
    ratios: Cell
    reliable: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return self.ratios.median

    def text(self) -> str:
        """'1.32x (1.25-1.41)', with ', unreliable: <reasons>' when it is."""
        r = self.ratios
        s = f"{r.median:.2f}x" + (f" ({r.lo:.2f}-{r.hi:.2f})" if r.n > 1 else "")
        return s if self.reliable else s + " unreliable: " + "; ".join(self.reasons)

    def to_dict(self) -> dict:
        r = self.ratios
        return {"median": round(r.median, 3), "min": round(r.lo, 3), "max": round(r.hi, 3),
                "ratios": [round(x, 3) for x in r.values], "reliable": self.reliable, "reasons": self.reasons}


def ratios(base_walls, walls) -> list[float]:
    """Per repeat: the baseline's wall time / the method's (the runs of one repeat are paired)."""
    if len(base_walls) != len(walls):
        raise ValueError(f"{len(base_walls)} baseline runs against {len(walls)} method runs: pair them by repeat")
    return [b / w for b, w in zip(base_walls, walls) if w > 0]


def verdict(rs, busy: float | None = None, max_disagree: float = MAX_DISAGREE,
            max_busy: float = MAX_BUSY) -> tuple[bool, list[str]]:
    """(reliable, reasons) for per-repeat speed-up ratios `rs`; busy: other processes' share of the
    CPUs during the runs (None: not known)."""
    c = cell(rs)
    reasons = []
    if c.n < 2:
        reasons.append("one run: no spread to judge")
    if c.lo < 1.0 < c.hi:
        reasons.append(f"the spread crosses 1.0 ({c.lo:.2f}x-{c.hi:.2f}x)")
    worst = max(abs(x - c.median) for x in c.values) / c.median if c.median else 0.0
    if worst > max_disagree:
        reasons.append(f"the runs disagree by more than {max_disagree:.0%} (up to {worst:.0%} from the median)")
    if busy is not None and busy > max_busy:
        reasons.append(f"the machine was busy (other processes used {busy:.0%} of the CPUs)")
    return not reasons, reasons


def speedup(base_walls, walls, busy: float | None = None, **kw) -> SpeedUp:
    rs = ratios(base_walls, walls)
    ok, why = verdict(rs, busy, **kw)
    return SpeedUp(cell(rs), ok, why)


def median_index(values) -> int:
    """The index of the median run (the lower middle for an even count): the run a view plays."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(values) - 1) // 2]


# -- the machine ------------------------------------------------------------------------------------
def _cpu_busy_s() -> float | None:
    """Seconds of CPU every process on the machine has used (/proc/stat; None off Linux)."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
    except OSError:
        return None
    v = [int(x) for x in parts]
    idle = v[3] + (v[4] if len(v) > 4 else 0)          # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """How much of the machine other processes took while this one ran: (all CPU seconds used on
    the machine - this process's own) / (wall seconds x CPUs). 0 on a quiet machine; a one-core hog
    on two cores reads ~0.5. Start with `start()`, read `busy()` at any time after."""

    def start(self) -> "CpuMeter":
        self.t0, self.own0, self.all0 = time.perf_counter(), time.process_time(), _cpu_busy_s()
        return self

    def busy(self) -> float | None:
        if self.all0 is None:
            return None
        wall = time.perf_counter() - self.t0
        others = (_cpu_busy_s() - self.all0) - (time.process_time() - self.own0)
        return min(1.0, max(0.0, others / (wall * (os.cpu_count() or 1)))) if wall > 0 else None


# -- running ----------------------------------------------------------------------------------------
@dataclass
class Interleaved:
    """What `interleave` measured: per name its R results and wall times (in run order), the order
    the calls ran in, and the machine's busy share over the whole measurement."""
    results: dict[str, list]
    walls: dict[str, list[float]]
    order: list[str]
    busy: float | None

    def cell(self, name: str) -> Cell:
        return cell(self.walls[name])

    def speedup(self, name: str, base: str, **kw) -> SpeedUp:
        return speedup(self.walls[base], self.walls[name], self.busy, **kw)

    def median_result(self, name: str):
        return self.results[name][median_index(self.walls[name])]


def interleave(fns: dict, repeats: int, wall=None, progress=None, errors: dict | None = None,
               catch: tuple = (ValueError,)) -> Interleaved:
    """Call every fn once per repeat, in the dict's order, repeat after repeat (a, b, c, a, b, c, ...).
    wall(result) -> seconds, the time a result reports (default: time.perf_counter around the call).
    errors: a dict to collect a name's exception (of the types in `catch`) in, instead of raising;
    that name's later calls are skipped.
    progress(done, total) after each call."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    results = {n: [] for n in fns}
    walls = {n: [] for n in fns}
    order, total, done = [], repeats * len(fns), 0
    meter = CpuMeter().start()
    for _ in range(repeats):
        for name, fn in fns.items():
            done += 1
            if errors is not None and name in errors:
                continue
            t0 = time.perf_counter()
            try:
                res = fn()
            except catch as e:
                if errors is None:
                    raise
                errors[name] = str(e)
                continue
            dt = time.perf_counter() - t0
            order.append(name)
            results[name].append(res)
            walls[name].append(float(wall(res)) if wall is not None else dt)
            if progress is not None:
                progress(done, total)
    failed = [n for n in fns if not walls[n]]
    for n in failed:
        results.pop(n), walls.pop(n)
    return Interleaved(results, walls, order, meter.busy())


# -- the bench's rows ------------------------------------------------------------------------------
def annotate_bench_rows(rows: list[dict], labels: list[str], runs: dict, base: str, busy: float | None,
                        thresholds: Thresholds | None = None) -> None:
    """Add to each bench row (speclab.bench.runner: `runs[label][repeat][prompt]` run dicts, the
    repeats interleaved prompt by prompt) its wall time's spread over the repeats, the speed-up as the
    median of per-repeat ratios with its spread and verdict (under `thresholds`, the defaults where
    None), and the cost model of its median pass against ar's pass of the same repeat (`cost_model`,
    and `why_slower` for a row slower than ar)."""
    from speclab import metrics
    th = thresholds or Thresholds()
    base_walls = [sum(r["wall_s"] for r in rep) for rep in runs[base]]
    for label, row in zip(labels, rows):
        walls = [sum(r["wall_s"] for r in rep) for rep in runs[label]]
        w = cell(walls)
        row["wall_s_range"] = [round(w.lo, 4), round(w.hi, 4)]
        up = speedup(base_walls, walls, busy, max_disagree=th.max_disagree, max_busy=th.max_busy)
        row["speedup_median"] = round(up.median, 3)
        row["speedup_range"] = [round(up.ratios.lo, 3), round(up.ratios.hi, 3)]
        row["speedup_ratios"] = [round(x, 3) for x in up.ratios.values]
        row["timing"] = "reliable" if up.reliable else "unreliable: " + "; ".join(up.reasons)
        if label == base:
            continue
        i = median_index(walls)
        traces = [r.get("trace") for r in runs[label][i]]
        refs = [r.get("trace") for r in runs[base][i]]
        if any(t is None or not t.steps_row().verify or not t.rounds for t in traces + refs):
            continue
        m = metrics.cost_model(traces, refs)
        if m is None:
            continue
        row["cost_model"] = {k: (round(v, 4) if isinstance(v, float) else
                                 [round(x, 3) for x in v] if isinstance(v, list) else v) for k, v in m.items()}
        if up.median < 1.0:
            row["why_slower"] = metrics.reason_line(m, up.median)
    if busy is not None:
        for row in rows:
            row["machine_busy"] = round(busy, 3)


def print_spread(res: dict) -> None:
    """The bench's lines under its table: each row's speed-up as a median with its spread and
    verdict, the cost model's expected speed-up beside it, and why a row slower than ar is slower."""
    reps = res.get("repeats", 1)
    busy = next((r["machine_busy"] for r in res["rows"] if "machine_busy" in r), None)
    print(f"speed-up = median over {reps} repeat(s) of ar's pass time / the method's, interleaved prompt by prompt"
          + (f"; other processes used {busy:.0%} of the CPUs meanwhile" if busy is not None else ""))
    print("  " + Thresholds(**res.get("verdict_thresholds", {})).text())
    for r in res["rows"]:
        if "speedup_median" not in r:
            continue
        lo, hi = r["speedup_range"]
        line = f"  {r['method']:<28} {r['prompt_set']:<12} {r['speedup_median']:.3f}x ({lo:.3f}-{hi:.3f}) {r['timing']}"
        m = r.get("cost_model")
        if m:
            fmt = lambda v: "-" if v is None else f"{v:.2f}"
            line += (f"; cost model: per-token alpha {fmt(m['token_alpha'])} (accepted / drafted {fmt(m['alpha'])}), "
                     f"k {m['k']}, c {m['c']:.2f} -> expected {m['expected_speedup']:.2f}x")
        print(line)
        if r.get("why_slower"):
            print(f"    slower than ar: {r['why_slower']}")


def spread_markdown(res: dict) -> str:
    """A bench result's speed-ups as a markdown table: median, range over the repeats, the verdict,
    the cost model's expected speed-up and, for a row slower than ar, why."""
    head = "| method | set | speed-up (median) | range | timing | expected (cost model) | why slower |\n|---|---|---|---|---|---|---|\n"
    body = ""
    for r in res["rows"]:
        if "speedup_median" not in r:
            continue
        m = r.get("cost_model")
        body += (f"| {r['method']} | {r['prompt_set']} | {r['speedup_median']:.2f}x | "
                 f"{r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f} | {r['timing']} | "
                 f"{'' if not m else format(m['expected_speedup'], '.2f') + 'x'} | {r.get('why_slower', '')} |\n")
    return head + body
