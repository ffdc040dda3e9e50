//! The [`StepRunner`] of Dockerfile and E2B template builds: each RUN step in a fresh gVisor
//! sandbox whose root's writes land in the step's host layer (`SandboxSpec::host_layer`),
//! FROM images pulled from registries. Used by `sandcell template build` and by the
//! daemon's E2B template API (crates/server templates/builds.rs). It lives here, next to
//! the runtime it drives, so that building a template needs the runtime and the image
//! crate, not the daemon.
//!
//! RUN steps have a network unless [`GvisorRunner::network`] is `None` (`sandcell template
//! build --network none`, a daemon started with `--no-network`): `apt-get install` and `pip
//! install` are what Dockerfile builds are for. The runtime writes the sandbox's
//! `/etc/resolv.conf` (our DNS server on the gateway) into the step's upper layer; it is
//! removed from the layer afterwards unless the step changed it (see [`RuntimeResolvConf`]).
//!
//! [`StepDeadlines`] bound a RUN step (and a FROM pull) in time: past its deadline the
//! step's sandbox is destroyed and the step fails saying which deadline it ran into, so a
//! `RUN sleep infinity` ends. The daemon sets them (`sandcell serve --build-timeout`,
//! `--build-step-timeout`); the CLI builds without.
//!
//! A [`BuildDisk`] bounds what the build's RUN steps write on the host: each step's upper
//! layer lives on a disk of its own no larger than what is left of the build's limit, so a
//! step that writes past it gets ENOSPC inside, its output ends with a line naming the
//! limit, and its disk is deleted (build_disk.rs). The daemon sets it (`sandcell serve
//! --build-disk-mib`), as does the CLI (`sandcell template build --disk-mib`).

use crate::build_disk::{BuildDisk, StepDisk};
use crate::gvisor::GvisorRuntime;
use crate::{
    HostLayer, Image, NetworkSpec, Runtime, Sandbox, SandboxSpec, agent_client, new_sandbox_id,
};
use sandcell_envd_client::{OutputKind, decode_data};
use sandcell_image::registry::PullOptions;
use sandcell_image::template::{RunRequest, StepRunner};
use sandcell_image::{NoProgress, ResolvedImage};
use sandcell_proto::agent::{Event, InitRequest, ProcessConfig, StartRequest};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long RUN steps and pulls may take: each step at most `step`, and none past `build`
/// (the whole build's deadline, an instant). `None`: unbounded.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepDeadlines {
    pub step: Option<Duration>,
    pub build: Option<(Instant, Duration)>,
}

impl StepDeadlines {
    /// The time left for the next step and what to say when it runs out; `Err` once the
    /// build's deadline has passed.
    fn budget(&self, now: Instant) -> Result<Option<(Duration, String)>, String> {
        let step = self
            .step
            .map(|d| (d, format!("the step deadline of {}", minutes(d))));
        let build = match self.build {
            Some((until, total)) => {
                let left = until.checked_duration_since(now).unwrap_or_default();
                if left.is_zero() {
                    return Err(format!(
                        "the build's deadline of {} passed: not started",
                        minutes(total)
                    ));
                }
                Some((left, format!("the build's deadline of {}", minutes(total))))
            }
            None => None,
        };
        Ok(match (step, build) {
            (Some(s), Some(b)) => Some(if s.0 <= b.0 { s } else { b }),
            (s, b) => s.or(b),
        })
    }
}

/// `90 s`, `15 min`.
fn minutes(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

/// RUN steps in gVisor sandboxes; FROM pulls from registries.
pub struct GvisorRunner {
    pub runtime: Arc<GvisorRuntime>,
    /// The runtime the blocking build thread enters for each step.
    pub handle: tokio::runtime::Handle,
    /// Memory and vCPUs of each RUN sandbox.
    pub memory_mib: u32,
    pub vcpus: u8,
    /// Where pulled blobs are cached (`<data-dir>/cache/blobs`).
    pub data_dir: PathBuf,
    pub pull: PullOptions,
    /// The network of each RUN sandbox (`None`: loopback only). Not part of the step cache
    /// key (as in Docker).
    pub network: Option<NetworkSpec>,
    /// How long each RUN step and pull may take.
    pub deadlines: StepDeadlines,
    /// How much the build's RUN steps may write on the host (`None`: unbounded).
    pub disk: Option<BuildDisk>,
}

/// Where the runtime writes a networked sandbox's resolver, relative to its root.
const RESOLV_CONF: &str = "etc/resolv.conf";

/// What the runtime wrote as a RUN sandbox's `/etc/resolv.conf` in the step's upper layer,
/// read before the step runs. If the file is byte-for-byte the same after the step, the
/// step did not write it (or wrote the same text, which we cannot tell apart and treat
/// alike) and it is dropped from the layer, so the image keeps its own resolv.conf (or
/// none); a step that changed or removed it keeps its result.
struct RuntimeResolvConf(Option<Vec<u8>>);

impl RuntimeResolvConf {
    fn read(upper: &Path) -> RuntimeResolvConf {
        RuntimeResolvConf(std::fs::read(upper.join(RESOLV_CONF)).ok())
    }

    /// After the sandbox is gone (its overlay unmounted).
    fn drop_if_unchanged(&self, upper: &Path) -> Result<(), String> {
        let Some(written) = &self.0 else {
            return Ok(());
        };
        let path = upper.join(RESOLV_CONF);
        let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if is_file && std::fs::read(&path).is_ok_and(|now| &now == written) {
            sandcell_image::template::drop_runtime_file(upper, Path::new(RESOLV_CONF))
                .map_err(|e| format!("removing the runtime's resolv.conf from the layer: {e}"))?;
        }
        Ok(())
    }
}

impl StepRunner for GvisorRunner {
    fn run(&self, request: &RunRequest, output: &mut dyn FnMut(&[u8])) -> Result<i32, String> {
        self.handle.block_on(self.run_step(request, output))
    }

    fn pull(&self, reference: &str) -> sandcell_image::Result<ResolvedImage> {
        let cache = sandcell_image::cache::BlobCache::in_data_dir(&self.data_dir);
        let timed_out = |why: String| sandcell_image::Error::Manifest {
            what: format!("pulling {reference}"),
            problem: why,
        };
        let budget = self.deadlines.budget(Instant::now()).map_err(timed_out)?;
        let pull = sandcell_image::registry::pull(reference, &cache, &self.pull, &NoProgress);
        match budget {
            None => self.handle.block_on(pull),
            Some((left, what)) => self
                .handle
                .block_on(tokio::time::timeout(left, pull))
                .map_err(|_| timed_out(format!("the pull ran past {what}")))?,
        }
    }
}

impl GvisorRunner {
    async fn run_step(
        &self,
        request: &RunRequest,
        output: &mut dyn FnMut(&[u8]),
    ) -> Result<i32, String> {
        let id = new_sandbox_id().map_err(|e| e.to_string())?;
        let image = Image {
            name: format!("build step {id}"),
            rootfs_dir: Some(request.base.clone()),
            rootfs_ext4: None,
        };
        // The step's own disk, when the build's writes are bounded: its upper layer lives
        // there and is copied out into `request.upper` if the step succeeds.
        let disk = match &self.disk {
            Some(d) => Some(d.prepare(&request.upper).await.map_err(|e| e.to_string())?),
            None => None,
        };
        let result = self.run_on(id, image, request, disk.as_ref(), output).await;
        let Some(step_disk) = disk else {
            return result;
        };
        let result = match (result, &self.disk) {
            (Ok(0), Some(d)) => d
                .copy_out(&step_disk, &request.upper)
                .map(|bytes| {
                    tracing::debug!(bytes, "build step's layer copied out of its disk");
                    0
                })
                .map_err(|e| e.to_string()),
            (other, _) => other,
        };
        // What the step wrote goes with its disk, whatever happened.
        if let Err(e) = step_disk.remove() {
            tracing::warn!("build step: {e}");
            return result.and(Err(e.to_string()));
        }
        result
    }

    /// Runs the step in a sandbox whose upper layer is `disk`'s, or `request.upper`.
    async fn run_on(
        &self,
        id: String,
        image: Image,
        request: &RunRequest,
        disk: Option<&StepDisk>,
        output: &mut dyn FnMut(&[u8]),
    ) -> Result<i32, String> {
        let (upper, work) = match disk {
            Some(d) => (d.upper(), d.work()),
            None => (request.upper.clone(), request.work.clone()),
        };
        let mut spec = SandboxSpec::new(id, image);
        spec.memory_mib = self.memory_mib;
        spec.vcpus = self.vcpus;
        spec.boot_timeout = Duration::from_secs(60);
        spec.network = self.network.clone();
        spec.host_layer = Some(HostLayer {
            lowers: request.lowers.clone(),
            upper: upper.clone(),
            work,
        });
        let sandbox: Arc<dyn Sandbox> = match self.runtime.create(spec).await {
            Ok(sb) => Arc::from(sb),
            Err(e) => return Err(e.to_string()),
        };
        // Written at create (through the overlay, into the upper layer).
        let resolv = RuntimeResolvConf::read(&upper);
        let result = match self.deadlines.budget(Instant::now()) {
            Err(why) => Err(why),
            Ok(None) => run_in(&sandbox, request, output).await,
            // Past it the step's future is dropped and its sandbox destroyed below.
            Ok(Some((left, what))) => tokio::time::timeout(left, run_in(&sandbox, request, output))
                .await
                .unwrap_or_else(|_| {
                    Err(format!("the step ran past {what}: its sandbox was killed"))
                }),
        };
        // The layer is read once the sandbox (and its mount) is gone.
        if let Err(e) = sandbox.destroy().await {
            return Err(format!("removing build sandbox {}: {e}", sandbox.id()));
        }
        if let Some(d) = disk
            && !matches!(result, Ok(0))
            && d.is_full()
        {
            output(d.full_message().as_bytes());
        }
        resolv.drop_if_unchanged(&upper)?;
        result
    }
}

async fn run_in(
    sandbox: &Arc<dyn Sandbox>,
    request: &RunRequest,
    output: &mut dyn FnMut(&[u8]),
) -> Result<i32, String> {
    sandbox.start().await.map_err(|e| e.to_string())?;
    if let Some(user) = request.user.as_deref() {
        set_default_user(sandbox, user).await?;
    }
    let (cmd, args) = request
        .argv
        .split_first()
        .ok_or_else(|| "an empty command".to_string())?;
    let client = agent_client(sandbox.clone());
    let start = StartRequest {
        process: ProcessConfig {
            cmd: cmd.clone(),
            args: args.to_vec(),
            envs: request.env.clone(),
            cwd: request.cwd.clone(),
        },
        stdin: Some(false),
        tag: None,
    };
    let mut stream = client
        .start(&start)
        .await
        .map_err(|e| format!("starting {cmd:?}: {e}"))?;
    while let Some(message) = stream.next().await {
        match message.map_err(|e| format!("{cmd:?}: {e}"))?.event {
            Event::Data(data) => match decode_data(&data) {
                Ok((OutputKind::Stderr | OutputKind::Stdout, bytes)) => output(&bytes),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            },
            Event::End(end) => {
                if let Some(error) = end.error.as_deref().filter(|e| !e.is_empty()) {
                    output(format!("sandcell: {cmd}: {error}\n").as_bytes());
                }
                return Ok(end.shell_status());
            }
            _ => {}
        }
    }
    Err(format!(
        "{cmd:?}: the agent's stream ended without an exit status"
    ))
}

/// `POST /init {"defaultUser": ...}`: the agent runs the step's processes as USER (a name
/// from the image's /etc/passwd; the part before `:`).
async fn set_default_user(sandbox: &Arc<dyn Sandbox>, user: &str) -> Result<(), String> {
    let name = user.split(':').next().unwrap_or(user);
    if name.is_empty() || name == "root" || name == "0" {
        return Ok(());
    }
    let init = InitRequest {
        default_user: Some(name.to_string()),
        ..InitRequest::default()
    };
    let client = agent_client(sandbox.clone());
    tokio::time::timeout(Duration::from_secs(10), client.init(&init))
        .await
        .map_err(|_| "POST /init: no answer within 10 s".to_string())?
        .map_err(|e| format!("POST /init (USER {user}): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_pick_the_nearer_and_say_which() {
        let now = Instant::now();
        assert!(StepDeadlines::default().budget(now).unwrap().is_none());
        let d = StepDeadlines {
            step: Some(Duration::from_secs(900)),
            build: Some((now + Duration::from_secs(60), Duration::from_secs(1800))),
        };
        let (left, what) = d.budget(now).unwrap().unwrap();
        assert_eq!(left, Duration::from_secs(60));
        assert_eq!(what, "the build's deadline of 30 min");
        let (left, what) = d.budget(now - Duration::from_secs(1000)).unwrap().unwrap();
        assert_eq!(left, Duration::from_secs(900));
        assert_eq!(what, "the step deadline of 15 min");
        let late = d.budget(now + Duration::from_secs(61)).unwrap_err();
        assert!(late.contains("deadline of 30 min passed"), "{late}");
    }
}
