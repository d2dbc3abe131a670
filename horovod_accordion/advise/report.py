"""The advisor's output: a table per link, a one-line verdict per setting, and one PNG."""

__all__ = ["table", "verdicts", "plot"]


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


def plot(results, workers, links, variants, path):
    """Speedup against ``none`` per world size: one line per compression, one panel per link;
    the band is the range from the measurement's spread."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(links), figsize=(4.5 * len(links), 3.8), sharey=True, squeeze=False)
    for axis, link in zip(axes[0], links):
        for variant in variants:
            none = [results[(link.name, w, "none")]["median"] for w in workers]
            mine = [results[(link.name, w, variant)] for w in workers]
            line, = axis.plot(workers, [n / p["median"] for n, p in zip(none, mine)], marker="o", label=variant)
            axis.fill_between(workers, [n / p["slowest"] for n, p in zip(none, mine)],
                              [n / p["fastest"] for n, p in zip(none, mine)], color=line.get_color(), alpha=0.15)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_title(f"link {link.name}")
        axis.set_xlabel("workers")
    axes[0][0].set_ylabel("predicted speedup over none")
    axes[0][-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
