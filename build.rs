//! Two link-time choices for the binaries' start.
//!
//! Packs the binaries' relative relocations (`-z pack-relative-relocs`, DT_RELR) when the
//! C library they will load against can read them.
//!
//! A position-independent binary carries one relocation per pointer in its data (vtables,
//! tables of `&str`): 9,204 of them, a 225 KB `.rela.dyn` that the loader reads at every
//! start. Packed, the table is under 3 KB: the stripped binary is 217 KB smaller and the
//! first answer comes 18 page faults sooner (docs/benchmarks.md, "Eleventh session").
//!
//! Only glibc 2.36 and later load a packed binary (it then requires the
//! `GLIBC_ABI_DT_RELR` version), so the flag is given only for a native build on a machine
//! whose glibc has it: `cargo run` works wherever it builds, and the Dockerfile builds and
//! runs on the same bookworm glibc. Set `AGENT_SANDBOX_PORTABLE_RELOCS=1` to leave the
//! relocations unpacked, for a binary built here that must run under an older glibc.
//!
//! Also links the unwinder (libgcc_eh) into the binaries instead of loading `libgcc_s.so.1` at
//! every start: on a Linux GNU target, std asks for the shared library, whose loading and
//! whose constructor (`__cpu_indicator_init`, a run of `cpuid` instructions, each one a trap
//! to the hypervisor in a VM: 5 µs apiece on this one) took 0.08-0.4 ms of a 4-5 ms cold
//! start (docs/benchmarks.md, "Thirteenth session"). Named here, before std's `-lgcc_s`, the
//! archive provides the `_Unwind_*` functions and the linker (`--as-needed`) drops the
//! shared library. Panics unwind as before: a handler's panic is still a 500. A toolchain
//! whose C compiler has no `libgcc_eh.a` (asked with `-print-file-name`) keeps the shared
//! library rather than failing to link.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=AGENT_SANDBOX_PORTABLE_RELOCS");
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if gnu_linux && libgcc_eh_found() {
        // gcc's driver, which links, searches its own directory for libgcc_eh.a.
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
    let portable = std::env::var_os("AGENT_SANDBOX_PORTABLE_RELOCS").is_some_and(|v| v != "0");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    if !portable && native && gnu_linux && glibc_reads_relr() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this machine's glibc is 2.36 or later (`getconf GNU_LIBC_VERSION` prints
/// `glibc 2.36`); anything unreadable counts as no.
fn glibc_reads_relr() -> bool {
    let Ok(output) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}

/// Whether the C compiler that links (the target's configured linker, else `CC`, else
/// `cc`) has `libgcc_eh.a`: `-print-file-name` prints its path, or the bare name when it
/// has none.
fn libgcc_eh_found() -> bool {
    println!("cargo:rerun-if-env-changed=CC");
    let compiler = std::env::var("RUSTC_LINKER")
        .or_else(|_| std::env::var("CC"))
        .unwrap_or_else(|_| "cc".into());
    let Ok(output) = Command::new(compiler)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return false;
    };
    let path = String::from_utf8_lossy(&output.stdout);
    let path = std::path::Path::new(path.trim());
    path.is_absolute() && path.exists()
}
