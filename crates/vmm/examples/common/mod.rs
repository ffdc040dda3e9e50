//! What the `sandcell-vmm` benchmarks share: argument pairs, p50/p90/p99 summaries,
//! memory figures from smaps_rollup, and printing the JSON result.

#![allow(dead_code)] // each example uses a different subset

/// Reads the command line as `--key value` pairs, handing each to `set`.
pub fn parse_pairs(mut set: impl FnMut(&str, String) -> Result<(), String>) -> Result<(), String> {
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        set(&k, v)?;
    }
    Ok(())
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// p50, p90, p99, min and max of `samples` (at least one), and the sorted samples.
pub fn summary(mut samples: Vec<f64>) -> (serde_json::Value, Vec<f64>) {
    samples.sort_by(f64::total_cmp);
    let stats = serde_json::json!({
        "p50": percentile(&samples, 50.0),
        "p90": percentile(&samples, 90.0),
        "p99": percentile(&samples, 99.0),
        "min": samples[0],
        "max": samples[samples.len() - 1],
    });
    (stats, samples)
}

/// (Rss, Pss) in MiB of process `pid`, from /proc/<pid>/smaps_rollup.
pub fn rollup_mib(pid: u32) -> Result<(f64, f64), String> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .map_err(|e| format!("reading smaps_rollup: {e}"))?;
    let field = |name: &str| -> Result<f64, String> {
        let line = rollup
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| format!("{name} missing from smaps_rollup"))?;
        let kib: f64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("bad {name} line {line:?}"))?;
        Ok(kib / 1024.0)
    };
    Ok((field("Rss:")?, field("Pss:")?))
}

/// Exits 2 with `<bench>: <error>` when the arguments did not parse.
pub fn args_or_exit<T>(bench: &str, parsed: Result<T, String>) -> T {
    match parsed {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{bench}: {e}");
            std::process::exit(2);
        }
    }
}

/// Prints the result as pretty JSON, or exits 1 with `<bench>: <error>`.
pub fn print_or_exit(bench: &str, result: Result<serde_json::Value, String>) {
    match result {
        Ok(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
        Err(e) => {
            eprintln!("{bench}: {e}");
            std::process::exit(1);
        }
    }
}
