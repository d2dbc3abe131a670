"""The advisor's output: a table per link, a one-line verdict per setting, a warning when the
profile's repeats spread too far to be trusted, and one PNG."""

import textwrap

from horovod_accordion.advise.predict import SPREAD_LIMIT

__all__ = ["table", "verdicts", "trust_warning", "plot"]


def _speedup(baseline, predicted):
    return baseline["median"] / predicted["median"]


def table(results, workers, links, variants):
    """``results[(link name, workers, variant)]`` is ``predict``'s dict: the text table."""
    lines = []
    for link in links:
        lines.append(f"\nlink {link.name}, {link.latency_s * 1e6:g} µs per hop"
                     f"{f', shared by {link.shared_by} ranks' if link.shared_by > 1 else ''}")
        lines.append(f"{'workers':>7}  {'compression':<26}{'step ms':>9}  {'range ms':<17}{'vs none':>8}{'vs fp16':>9}")
        for w in workers:
            for variant in variants:
                p = results[(link.name, w, variant)]
                against = [f"{_speedup(results[(link.name, w, base)], p):7.2f}x" if (link.name, w, base) in results
                           else f"{'-':>8}" for base in ("none", "fp16")]
                spread = f"{p['fastest'] * 1e3:.1f}–{p['slowest'] * 1e3:.1f}"
                lines.append(f"{w:>7}  {variant:<26}{p['median'] * 1e3:9.1f}  {spread:<17}{against[0]} {against[1]}")
    return "\n".join(lines)


def verdicts(results, workers, links, variants):
    """One line per setting: the fastest compression, and by how much it beats fp16."""
    lines = []
    for link in links:
        for w in workers:
            fastest = min(variants, key=lambda v: results[(link.name, w, v)]["median"])
            best = results[(link.name, w, fastest)]
            line = f"{w} workers, {link.name}: {fastest} is fastest ({best['median'] * 1e3:.1f} ms/step"
            # By how much it beats fp16; where fp16 is fastest, by how much it beats the next best.
            other = "fp16" if fastest != "fp16" else min((v for v in variants if v != "fp16"),
                                                         key=lambda v: results[(link.name, w, v)]["median"])
            if (link.name, w, other) in results and other != fastest:
                theirs = results[(link.name, w, other)]
                overlap = " — within the measured spread" if best["slowest"] >= theirs["fastest"] else ""
                line += f", {_speedup(theirs, best):.2f}x {other}'s{overlap}"
            lines.append(line + ")")
    return lines


def _speedup_ticks(low, high):
    """Plain tick values between ``low`` and ``high`` (0.5, 1, 2, 5, ...), finer where that gives
    fewer than four."""
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [round(m * 10.0 ** e, 6) for e in range(-3, 4) for m in mantissas if low <= m * 10.0 ** e <= high]
        if len(ticks) >= 4:
            break
    return ticks


def trust_warning(unreliable):
    """The lines that say a profile is not to be trusted, why, and what to do; none if it is.
    ``unreliable`` is ``predict.unreliable_times``'s list."""
    if not unreliable:
        return []
    spreads = "; ".join(f"{what} {spread:.1f}×" for what, spread in unreliable)
    return [f"UNRELIABLE PROFILE: repeats spread by more than {SPREAD_LIMIT:g}× (slowest over fastest): {spreads}.",
            "The machine was most likely busy while profiling, so these predictions are not to be trusted.",
            "Profile again on a quiet machine, on the cluster's own device (--device cuda), with more repeats "
            "(--repeats 20)."]


def plot(results, workers, links, variants, path, warning=()):
    """Speedup against ``none`` per world size: one line per compression, one panel per link;
    the band is the range from the measurement's spread, and the region where compression pays
    (a speedup above 1) is shaded. ``warning``: ``trust_warning``'s lines, written above the
    panels, since the picture travels without the text. Returns ``path``, or None where
    matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    def speedups(link, variant, statistic):
        return [results[(link.name, w, "none")]["median"] / results[(link.name, w, variant)][statistic]
                for w in workers]

    spread = [value for link in links for variant in variants for statistic in ("fastest", "slowest")
              for value in speedups(link, variant, statistic)]
    low, high = min(spread + [1.0]) / 1.2, max(spread + [1.0]) * 1.2
    figure, axes = plt.subplots(1, len(links), figsize=(4.5 * len(links), 3.8), sharey=True, squeeze=False)
    for axis, link in zip(axes[0], links):
        axis.axhspan(1.0, high, color="tab:green", alpha=0.08, linewidth=0)
        axis.text(0.03, 0.97, "compression pays (faster than none)", transform=axis.transAxes, va="top",
                  fontsize=7, color="darkgreen")
        axis.axhline(1.0, color="grey", linewidth=0.8)
        for variant in variants:
            line, = axis.plot(workers, speedups(link, variant, "median"), marker="o", linewidth=1.5,
                              markersize=4, label=variant)
            axis.fill_between(workers, speedups(link, variant, "slowest"), speedups(link, variant, "fastest"),
                              color=line.get_color(), alpha=0.12, linewidth=0)
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_locator(FixedLocator(workers))
        axis.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_yscale("log")
        axis.set_ylim(low, high)
        axis.yaxis.set_major_locator(FixedLocator(_speedup_ticks(low, high)))
        axis.yaxis.set_major_formatter(lambda value, _: f"{value:g}")
        axis.yaxis.set_minor_locator(NullLocator())
        axis.set_title(f"link {link.name}")
        axis.set_xlabel("workers")
    axes[0][0].set_ylabel("predicted speedup over none")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    figure.tight_layout()
    if warning:
        figure.text(0.01, 1.0, "\n".join(textwrap.wrap(" ".join(warning), 40 * len(links) + 60)), ha="left",
                    va="bottom", fontsize=8, color="darkred", weight="bold")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path
