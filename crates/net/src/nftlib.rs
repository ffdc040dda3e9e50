//! nftables in-process: `libnftables`, the library the `nft` command is a thin front for,
//! loaded with `dlopen` the first time a rule changes. Same grammar, same atomic
//! transactions, same error text as `nft -f -`, without a fork and exec per change: a
//! create with egress rules, a DNS answer that opens an address, a private network's
//! peers and a teardown each cost one netlink transaction instead of a process (measured
//! in `bench/net`, `nft_apply_*`).
//!
//! Why `dlopen` and not a link-time dependency: the library comes with the `nftables`
//! package that the daemon needs anyway, but building Sandcell should not need its `-dev`
//! package, and a host without it must still work. Where the library cannot be loaded, or
//! `SANDCELL_NFT=process` is set (to replay exactly what a shell would), or the program is
//! statically linked (the nested harness's build), `cmd.rs` runs the `nft` program as before.
//!
//! A libnftables context is not thread-safe: one context serves the whole process behind a
//! mutex. The kernel serialises nftables transactions anyway (one commit mutex per
//! namespace), and a transaction here takes well under a millisecond of its hold.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

/// `NFT_CTX_DEFAULT` (libnftables.h).
const NFT_CTX_DEFAULT: u32 = 0;
/// `NFT_CTX_OUTPUT_JSON` (libnftables.h): `nft -j`.
const NFT_CTX_OUTPUT_JSON: c_uint = 1 << 4;
/// The soname Debian's `libnftables1` (and every distribution since nftables 0.9) ships.
const SONAME: &CStr = c"libnftables.so.1";

type NewFn = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetBufFn = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type GetFlagsFn = unsafe extern "C" fn(*mut c_void) -> c_uint;
type SetFlagsFn = unsafe extern "C" fn(*mut c_void, c_uint);

/// The library's entry points and the process's one context.
struct Nft {
    ctx: *mut c_void,
    run: RunFn,
    output: GetBufFn,
    error: GetBufFn,
    get_flags: GetFlagsFn,
    set_flags: SetFlagsFn,
}

// SAFETY: the context is only ever used through `&mut Nft` taken from the mutex below, so
// no two threads use it at once; libnftables keeps no thread-local state of its own.
unsafe impl Send for Nft {}

/// What a run of a script or command gave: its output when it succeeded, the library's
/// error text (what `nft` prints on stderr) when it failed.
pub(crate) type Outcome = std::result::Result<String, String>;

/// The shared context, or `None` where the library cannot be used (then callers spawn
/// `nft`). Loaded once: a later failure to load would fail the same way.
fn shared() -> Option<&'static Mutex<Nft>> {
    static NFT: OnceLock<Option<Mutex<Nft>>> = OnceLock::new();
    NFT.get_or_init(|| {
        if std::env::var("SANDCELL_NFT").is_ok_and(|v| v == "process") {
            tracing::info!("SANDCELL_NFT=process: nftables changes run the nft program");
            return None;
        }
        match Nft::load() {
            Ok(nft) => {
                tracing::debug!("nftables changes go through libnftables in-process");
                Some(Mutex::new(nft))
            }
            Err(why) => {
                tracing::warn!(
                    "libnftables could not be loaded ({why}): every nftables change runs the \
                     nft program instead (slower: a process per change)"
                );
                None
            }
        }
    })
    .as_ref()
}

/// Whether rule changes run in-process (for `doctor` and the benchmarks).
pub fn in_process() -> bool {
    shared().is_some()
}

/// Runs `text` (a script, as `nft -f -` reads it, or one command, as `nft ARGS` takes it)
/// in one transaction; `json` asks for `nft -j` output. `None` when the library is not in
/// use: the caller runs the program.
pub(crate) fn run(text: &str, json: bool) -> Option<Outcome> {
    let nft = shared()?;
    let text = match CString::new(text) {
        Ok(t) => t,
        // Our scripts never hold NUL; the program would stop reading at one too.
        Err(_) => return Some(Err("the nftables script holds a NUL byte".into())),
    };
    let mut nft = nft
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Some(nft.run(&text, json))
}

impl Nft {
    fn load() -> std::result::Result<Nft, String> {
        // A statically linked glibc program crashes in dlopen where a dynamic loader and the
        // library exist (seen: SIGSEGV in the static `sandcell` the nested harness builds,
        // on the first rule change), and fails where they do not.
        if cfg!(target_feature = "crt-static") {
            return Err("this is a static build, which cannot load shared libraries".into());
        }
        // SAFETY: dlopen with a constant NUL-terminated name; the handle is never closed,
        // so the symbols below stay valid for the life of the process.
        let lib = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(dl_error());
        }
        // SAFETY: each type named is the C signature of that libnftables function
        // (libnftables.h, stable since nftables 0.9), argument for argument; `lib` is live.
        let (new, buffer_output, buffer_error, nft) = unsafe {
            let new: NewFn = symbol(lib, c"nft_ctx_new")?;
            let buffer_output: CtxFn = symbol(lib, c"nft_ctx_buffer_output")?;
            let buffer_error: CtxFn = symbol(lib, c"nft_ctx_buffer_error")?;
            let nft = Nft {
                ctx: std::ptr::null_mut(),
                run: symbol(lib, c"nft_run_cmd_from_buffer")?,
                output: symbol(lib, c"nft_ctx_get_output_buffer")?,
                error: symbol(lib, c"nft_ctx_get_error_buffer")?,
                get_flags: symbol(lib, c"nft_ctx_output_get_flags")?,
                set_flags: symbol(lib, c"nft_ctx_output_set_flags")?,
            };
            (new, buffer_output, buffer_error, nft)
        };
        // SAFETY: nft_ctx_new takes flags by value and returns an owned context or NULL.
        let ctx = unsafe { new(NFT_CTX_DEFAULT) };
        if ctx.is_null() {
            return Err("nft_ctx_new failed".into());
        }
        // Output and errors into memory buffers rather than the daemon's stdout/stderr.
        // SAFETY: `ctx` is the live context just made; both calls only set up its buffers.
        let (o, e) = unsafe { (buffer_output(ctx), buffer_error(ctx)) };
        if o != 0 || e != 0 {
            return Err("libnftables could not buffer its output".into());
        }
        Ok(Nft { ctx, ..nft })
    }

    fn run(&mut self, text: &CStr, json: bool) -> Outcome {
        // SAFETY: `self.ctx` is the live context (only used under the mutex); the flag
        // calls read and write an integer of it.
        let flags = unsafe { (self.get_flags)(self.ctx) };
        let wanted = if json {
            flags | NFT_CTX_OUTPUT_JSON
        } else {
            flags & !NFT_CTX_OUTPUT_JSON
        };
        if wanted != flags {
            // SAFETY: as above.
            unsafe { (self.set_flags)(self.ctx, wanted) };
        }
        // SAFETY: `text` is NUL-terminated and outlives the call; libnftables does not keep
        // it. The call parses, evaluates and commits in one netlink batch.
        let rc = unsafe { (self.run)(self.ctx, text.as_ptr()) };
        // Both buffers are read after every run, success or not: a read rewinds the
        // buffer, so the next run starts empty.
        let out = self.take(self.output);
        let err = self.take(self.error);
        if rc == 0 {
            Ok(out)
        } else if err.trim().is_empty() {
            Err(format!(
                "libnftables failed (return code {rc}) without a message"
            ))
        } else {
            Err(err)
        }
    }

    fn take(&mut self, get: GetBufFn) -> String {
        // SAFETY: the getter returns a NUL-terminated buffer owned by the context, valid
        // until the next call on it; it is copied at once, under the mutex.
        unsafe {
            let p = get(self.ctx);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }
}

/// The function `name` of the library `lib` as an `F`.
///
/// # Safety
/// `lib` is a live dlopen handle and `F` is the `unsafe extern "C" fn` type whose signature
/// is the C declaration of `name`.
unsafe fn symbol<F: Copy>(lib: *mut c_void, name: &CStr) -> std::result::Result<F, String> {
    // A fn pointer is what is asked for, and it has a data pointer's size on Linux.
    if std::mem::size_of::<F>() != std::mem::size_of::<*mut c_void>() {
        return Err(format!(
            "{} is not a function pointer type",
            std::any::type_name::<F>()
        ));
    }
    // SAFETY: `lib` is live (the caller's promise), `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(format!(
            "{} has no {}",
            SONAME.to_string_lossy(),
            name.to_string_lossy()
        ));
    }
    // SAFETY: same size (checked above); the caller promises `F` is this symbol's type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message owned by libc, read at once.
    unsafe {
        let p = libc::dlerror();
        if p.is_null() {
            format!("dlopen {} failed", SONAME.to_string_lossy())
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // These run where the tests run as root with nftables (CI does): they change the
    // host's ruleset only inside a table of their own, removed at the end.

    #[test]
    fn a_script_commits_and_lists_like_the_program() {
        if !in_process() {
            panic!("libnftables did not load: the daemon would fall back to the nft program");
        }
        let t = format!("sandcell_libtest_{}", std::process::id());
        let script = format!(
            "add table inet {t}\ndelete table inet {t}\ntable inet {t} {{\n  set s {{ type ipv4_addr; flags interval; }}\n}}\nadd element inet {t} s {{ 10.1.0.0/16 }}\n"
        );
        run(&script, false)
            .expect("loaded")
            .expect("the script commits");
        let listed = run(&format!("list set inet {t} s"), false)
            .expect("loaded")
            .expect("listed");
        assert!(listed.contains("10.1.0.0/16"), "{listed}");
        let json = run(&format!("list set inet {t} s"), true)
            .expect("loaded")
            .expect("listed");
        let v: serde_json::Value = serde_json::from_str(&json).expect("JSON output");
        assert!(v.get("nftables").is_some(), "{json}");
        // A later plain listing is not JSON: the flag is per call.
        let plain = run(&format!("list set inet {t} s"), false)
            .expect("loaded")
            .expect("listed");
        assert!(plain.trim_start().starts_with("table"), "{plain}");
        run(&format!("delete table inet {t}"), false)
            .expect("loaded")
            .expect("deleted");
    }

    #[test]
    fn a_failing_transaction_changes_nothing_and_says_why() {
        if !in_process() {
            panic!("libnftables did not load");
        }
        let t = format!("sandcell_libfail_{}", std::process::id());
        // The second line is wrong: the whole batch, the table included, must not commit.
        let err = run(
            &format!("add table inet {t}\nadd set inet {t} s {{ type nosuchtype; }}\n"),
            false,
        )
        .expect("loaded")
        .expect_err("a bad script fails");
        assert!(
            err.contains("nosuchtype"),
            "the error names what is wrong: {err}"
        );
        let tables = run("list tables inet", false)
            .expect("loaded")
            .expect("listed");
        assert!(
            !tables.contains(&t),
            "the failed batch left its table: {tables}"
        );
        // The context is still usable after a failure, and its error buffer was drained.
        let ok = run("list tables inet", false).expect("loaded");
        assert!(ok.is_ok(), "{ok:?}");
    }
}
