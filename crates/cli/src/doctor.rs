//! `sandcell doctor`: what this host offers and which runtime `auto` picks.

use crate::DoctorArgs;
use sandcell_runtime::host::{self, HostReport, KvmKind};
use sandcell_runtime::{Dirs, Image, RuntimeKind};

pub async fn doctor(dirs: Dirs, args: DoctorArgs) -> i32 {
    let image = Image::resolve(&dirs.images(), "minimal").ok();
    let report = host::report(&dirs, args.kernel.clone(), image.as_ref()).await;
    let usable = runtime_usable(&report);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("sandcell: encoding the report: {e}");
                return 1;
            }
        }
    } else {
        print_text(&report, image.is_some());
    }
    if usable { 0 } else { 1 }
}

fn runtime_usable(r: &HostReport) -> bool {
    match r.auto.runtime {
        RuntimeKind::Microvm => true,
        RuntimeKind::Gvisor => r.runsc.is_ok() && r.cgroup.is_some(),
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn print_text(r: &HostReport, have_image: bool) {
    println!("host kernel     {}", r.host_kernel);
    let kind = match r.kvm.kind {
        KvmKind::VtX => "Intel VT-x",
        KvmKind::AmdV => "AMD-V",
        KvmKind::Pvm => "PVM (no hardware virtualization)",
        KvmKind::Unknown => "unknown",
        KvmKind::None => "none",
    };
    println!(
        "KVM             present: {}, usable: {}, kind: {kind}",
        yes(r.kvm.present),
        yes(r.kvm.usable)
    );
    println!("                {}", r.kvm.detail);
    match &r.runsc {
        Ok(info) => {
            println!("runsc           {} ({})", info.path.display(), info.version);
            println!(
                "                platforms: {} (using {}), --overlay2: {}",
                info.platforms.join(", "),
                info.platform,
                yes(info.overlay2)
            );
        }
        Err(e) => println!("runsc           not usable: {e}"),
    }
    match r.cgroup {
        Some(v) => println!("cgroups         {v}"),
        None => {
            println!("cgroups         none found at /sys/fs/cgroup (the gvisor runtime needs them)")
        }
    }
    match &r.nftables {
        Some(v) => println!("nftables        {v}"),
        None => println!(
            "nftables        not installed (`apt install nftables`; needed for sandbox networking)"
        ),
    }
    match &r.vmm {
        Some(p) => println!("sandcell-vmm    {}", p.display()),
        None => {
            println!("sandcell-vmm    not found next to sandcell (build it, or set SANDCELL_VMM)")
        }
    }
    println!(
        "guest kernel    {} ({})",
        r.guest_kernel.path.display(),
        if r.guest_kernel.present {
            "present"
        } else {
            "missing: `make kernel install`"
        }
    );
    println!(
        "images          {} ({})",
        r.data_dir.join("images/minimal").display(),
        if have_image {
            "present"
        } else {
            "missing: `make images install`"
        }
    );
    println!("runtime (auto)  {}: {}", r.auto.runtime, r.auto.reason);
}
