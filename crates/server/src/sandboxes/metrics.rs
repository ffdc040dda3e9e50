//! Per-sandbox metrics, E2B's `GET /sandboxes/{id}/metrics` and `GET /sandboxes/metrics`:
//! CPU, memory and disk of every running sandbox, sampled by the host every
//! [`SAMPLE_INTERVAL`] from what the runtime measures outside the guest (its cgroup or its
//! VMM process, and its disk), never from anything the guest says about itself.
//!
//! Kept in memory, per sandbox, for its lifetime and [`KEEP_AFTER_END`] after it: at most
//! [`MAX_SAMPLES`] each, and when a series is full its older half is thinned to every other
//! sample, so a long-lived sandbox keeps its whole history at a coarser grain and the memory
//! per sandbox stays bounded. A daemon restart starts the series again.

use crate::sandboxes::service::{SandboxService, lock};
use crate::store::State as DbState;
use crate::util::now_ms;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often running sandboxes are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// Samples kept per sandbox (4096 x 5 s is almost six hours at full grain).
pub const MAX_SAMPLES: usize = 4096;
/// How long the series of an ended sandbox stays readable.
pub const KEEP_AFTER_END: Duration = Duration::from_secs(10 * 60);

/// One measurement of one sandbox (E2B's `SandboxMetric`, in bytes and percent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at_ms: i64,
    pub cpu_count: u32,
    /// Of all its vCPUs together: 100 is every vCPU busy for the whole interval.
    pub cpu_used_pct: f32,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// What the runtime measured at one instant (the inputs of a [`Sample`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    pub cpu_usec: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub memory_cache_bytes: Option<u64>,
    pub disk_used: Option<u64>,
    pub disk_total: Option<u64>,
}

#[derive(Default)]
struct Series {
    samples: VecDeque<Sample>,
    /// The CPU counter at the last sample, for the next one's rate.
    last_cpu: Option<(Instant, u64)>,
    ended: Option<Instant>,
}

impl Series {
    fn push(&mut self, s: Sample) {
        if self.samples.len() >= MAX_SAMPLES {
            // Thin the older half: keep every other one of its samples.
            let half = self.samples.len() / 2;
            let older: Vec<Sample> = self.samples.drain(..half).collect();
            for (i, old) in older.into_iter().enumerate().rev() {
                if i % 2 == 0 {
                    self.samples.push_front(old);
                }
            }
        }
        self.samples.push_back(s);
    }
}

/// The series of every sandbox sampled by this daemon.
#[derive(Default)]
pub struct SampleStore {
    series: Mutex<HashMap<String, Series>>,
}

/// The CPU use between two readings of a counter, in percent of `vcpus` whole CPUs.
pub fn cpu_pct(prev: (Instant, u64), now: (Instant, u64), vcpus: u32) -> f32 {
    let wall_usec = now.0.saturating_duration_since(prev.0).as_micros() as f64;
    if wall_usec <= 0.0 || vcpus == 0 {
        return 0.0;
    }
    let used = now.1.saturating_sub(prev.1) as f64;
    (used / (wall_usec * f64::from(vcpus)) * 100.0).clamp(0.0, 100.0) as f32
}

impl SampleStore {
    /// Records a reading of sandbox `id` (its size: `vcpus`, `memory_mib`, `disk_mib`).
    pub fn record(
        &self,
        id: &str,
        at: (i64, Instant),
        size: (u32, u32, u32),
        reading: Reading,
    ) -> Sample {
        let (vcpus, memory_mib, disk_mib) = size;
        let mut all = lock(&self.series);
        let series = all.entry(id.to_string()).or_default();
        let cpu_used_pct = match (series.last_cpu, reading.cpu_usec) {
            (Some(prev), Some(now)) => cpu_pct(prev, (at.1, now), vcpus),
            _ => 0.0,
        };
        if let Some(now) = reading.cpu_usec {
            series.last_cpu = Some((at.1, now));
        }
        let mem_cache = reading.memory_cache_bytes.unwrap_or(0);
        let sample = Sample {
            at_ms: at.0,
            cpu_count: vcpus,
            cpu_used_pct,
            mem_used: reading.memory_bytes.unwrap_or(0).saturating_sub(mem_cache),
            mem_total: u64::from(memory_mib) << 20,
            mem_cache,
            disk_used: reading.disk_used.unwrap_or(0),
            disk_total: reading.disk_total.unwrap_or(u64::from(disk_mib) << 20),
        };
        series.push(sample);
        sample
    }

    /// The samples of `id` within `[from_ms, to_ms]`, oldest first.
    pub fn range(&self, id: &str, from_ms: i64, to_ms: i64) -> Vec<Sample> {
        lock(&self.series).get(id).map_or_else(Vec::new, |s| {
            s.samples
                .iter()
                .filter(|x| x.at_ms >= from_ms && x.at_ms <= to_ms)
                .copied()
                .collect()
        })
    }

    pub fn latest(&self, id: &str) -> Option<Sample> {
        lock(&self.series)
            .get(id)
            .and_then(|s| s.samples.back().copied())
    }

    /// The latest sample of every sandbox still sampled (for `/metrics`).
    pub fn latest_all(&self) -> Vec<(String, Sample)> {
        lock(&self.series)
            .iter()
            .filter(|(_, s)| s.ended.is_none())
            .filter_map(|(id, s)| s.samples.back().map(|x| (id.clone(), *x)))
            .collect()
    }

    /// Marks the series of sandboxes not in `running` as ended, and drops those that ended
    /// more than [`KEEP_AFTER_END`] ago.
    pub fn retain_running(&self, running: &[String], now: Instant) {
        let mut all = lock(&self.series);
        for (id, s) in all.iter_mut() {
            if !running.iter().any(|r| r == id) && s.ended.is_none() {
                s.ended = Some(now);
                s.last_cpu = None;
            } else if running.iter().any(|r| r == id) {
                s.ended = None;
            }
        }
        all.retain(|_, s| {
            s.ended
                .is_none_or(|t| now.saturating_duration_since(t) < KEEP_AFTER_END)
        });
    }
}

impl SandboxService {
    /// Samples every running sandbox of this daemon every [`SAMPLE_INTERVAL`], forever.
    pub async fn sample_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.sample_once().await;
        }
    }

    /// One round of [`Self::sample_forever`].
    pub async fn sample_once(&self) {
        let rows = match self.db.sandboxes_in(None, &[DbState::Running]).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!("sandbox metrics: {e}");
                return;
            }
        };
        let mut running = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(live) = self.live(&row.id) else {
                continue;
            };
            let usage = match live.sandbox.usage().await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!("sandbox {}: metrics: {e}", row.id);
                    continue;
                }
            };
            let disk = live.sandbox.disk_usage().await;
            let reading = Reading {
                cpu_usec: usage.cpu_usec,
                memory_bytes: usage.memory_bytes,
                memory_cache_bytes: usage.memory_cache_bytes,
                disk_used: disk.map(|d| d.used_bytes),
                disk_total: disk.map(|d| d.total_bytes),
            };
            self.samples.record(
                &row.id,
                (now_ms(), Instant::now()),
                (row.vcpus, row.memory_mib, row.disk_mib),
                reading,
            );
            running.push(row.id);
        }
        self.samples.retain_running(&running, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(cpu: u64, mem: u64, cache: u64) -> Reading {
        Reading {
            cpu_usec: Some(cpu),
            memory_bytes: Some(mem),
            memory_cache_bytes: Some(cache),
            disk_used: Some(7),
            disk_total: None,
        }
    }

    #[test]
    fn cpu_is_a_rate_over_all_vcpus() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        // 2 s of CPU time in 2 s of wall time on 2 vCPUs: half the sandbox's capacity.
        assert_eq!(cpu_pct((t0, 0), (t1, 2_000_000), 2), 50.0);
        // A counter that went backwards (a restore) or ran past capacity is clamped.
        assert_eq!(cpu_pct((t0, 5), (t1, 1), 2), 0.0);
        assert_eq!(cpu_pct((t0, 0), (t1, 10_000_000), 1), 100.0);
        assert_eq!(cpu_pct((t0, 0), (t0, 10), 1), 0.0);
    }

    #[test]
    fn samples_carry_sizes_rates_and_cache_apart_from_use() {
        let store = SampleStore::default();
        let t0 = Instant::now();
        let first = store.record(
            "a",
            (1000, t0),
            (2, 512, 100),
            reading(0, 300 << 20, 100 << 20),
        );
        assert_eq!(first.cpu_used_pct, 0.0, "no rate from a single reading");
        assert_eq!(first.mem_used, 200 << 20);
        assert_eq!(first.mem_cache, 100 << 20);
        assert_eq!(first.mem_total, 512 << 20);
        assert_eq!(
            first.disk_total,
            100 << 20,
            "the image's size when the runtime has none"
        );
        let t1 = t0 + Duration::from_secs(1);
        let second = store.record("a", (2000, t1), (2, 512, 100), reading(1_000_000, 1, 5));
        assert_eq!(second.cpu_used_pct, 50.0);
        assert_eq!(second.mem_used, 0, "cache above the total never underflows");
        assert_eq!(store.range("a", 0, 1500), vec![first]);
        assert_eq!(store.range("a", 0, i64::MAX).len(), 2);
        assert_eq!(store.latest("a"), Some(second));
        assert!(store.range("b", 0, i64::MAX).is_empty());
    }

    #[test]
    fn a_full_series_thins_its_older_half_and_stays_bounded() {
        let store = SampleStore::default();
        let t0 = Instant::now();
        for i in 0..(MAX_SAMPLES as i64 * 3) {
            store.record("a", (i, t0), (1, 128, 0), Reading::default());
        }
        let all = store.range("a", 0, i64::MAX);
        assert!(all.len() <= MAX_SAMPLES);
        assert_eq!(
            all.last().map(|s| s.at_ms),
            Some(MAX_SAMPLES as i64 * 3 - 1)
        );
        assert!(
            all.windows(2).all(|w| w[0].at_ms < w[1].at_ms),
            "still in order"
        );
        assert_eq!(
            all.first().map(|s| s.at_ms),
            Some(0),
            "the start is kept, coarser"
        );
    }

    #[test]
    fn ended_series_stay_a_while_then_go() {
        let store = SampleStore::default();
        let t0 = Instant::now();
        store.record("a", (1, t0), (1, 128, 0), Reading::default());
        store.record("b", (1, t0), (1, 128, 0), Reading::default());
        store.retain_running(&["b".to_string()], t0);
        assert!(store.latest("a").is_some(), "readable after its end");
        assert_eq!(
            store.latest_all().len(),
            1,
            "but no longer a running sandbox's"
        );
        store.retain_running(&["b".to_string()], t0 + KEEP_AFTER_END);
        assert!(store.latest("a").is_none());
        assert!(store.latest("b").is_some());
    }
}
