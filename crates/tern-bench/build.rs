//! Builds the UDT and SRT shims when their Debian headers are installed (otherwise those two
//! protocols report themselves unavailable), and records dependency versions from
//! Cargo.lock for the results files.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tern_bench_udt)");
    println!("cargo::rustc-check-cfg=cfg(tern_bench_srt)");
    println!("cargo::rerun-if-changed=shim/udt_shim.cpp");
    println!("cargo::rerun-if-changed=shim/srt_shim.c");
    println!("cargo::rerun-if-changed=/usr/include/udt/udt.h");
    println!("cargo::rerun-if-changed=/usr/include/srt/srt.h");
    println!("cargo::rerun-if-env-changed=TERN_BENCH_NO_SHIMS");
    let no_shims = std::env::var_os("TERN_BENCH_NO_SHIMS").is_some();

    if !no_shims && Path::new("/usr/include/udt/udt.h").exists() {
        cc::Build::new()
            .cpp(true)
            .file("shim/udt_shim.cpp")
            .flag_if_supported("-w")
            .compile("tb_udt_shim");
        println!("cargo::rustc-link-lib=udt");
        println!("cargo::rustc-link-lib=pthread");
        println!("cargo::rustc-cfg=tern_bench_udt");
    }
    if !no_shims && Path::new("/usr/include/srt/srt.h").exists() {
        cc::Build::new()
            .file("shim/srt_shim.c")
            .flag_if_supported("-w")
            .compile("tb_srt_shim");
        println!("cargo::rustc-link-lib=srt");
        println!("cargo::rustc-cfg=tern_bench_srt");
    }

    let lock = Path::new("../../Cargo.lock");
    println!("cargo::rerun-if-changed=../../Cargo.lock");
    let text = std::fs::read_to_string(lock).unwrap_or_default();
    let wanted = [
        "quinn",
        "quinn-proto",
        "rustls",
        "tokio",
        "plotters",
        "rtp",
        "socket2",
        "snow",
        "ring",
        "aws-lc-rs",
    ];
    let mut found = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = n.trim_matches('"').to_string();
        } else if let Some(v) = line.strip_prefix("version = ") {
            if wanted.contains(&name.as_str()) {
                found.push(format!("{name}={}", v.trim_matches('"')));
            }
        }
    }
    found.sort();
    found.dedup();
    println!(
        "cargo::rustc-env=TERN_BENCH_DEP_VERSIONS={}",
        found.join(";")
    );
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo::rustc-env=TERN_BENCH_RUSTC={version}");

    // The tern under test as built: git revision plus whether the work tree differed.
    for dir in [
        "../tern/src",
        "../tern-proto/src",
        "../../.git/HEAD",
        "../../.git/index",
    ] {
        println!("cargo::rerun-if-changed={dir}");
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "../tern",
        "../tern-proto",
    ])
    .is_some_and(|s| !s.is_empty());
    println!(
        "cargo::rustc-env=TERN_BENCH_BUILD_GIT={rev}{}",
        if dirty {
            " + uncommitted changes to tern/tern-proto"
        } else {
            ""
        }
    );
}
