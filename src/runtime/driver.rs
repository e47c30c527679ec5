//! The choice of I/O driver. Its own module, not `runtime`'s root: [`super::file`] opens
//! files for the driver in use, and the root re-exports `file`.

use std::io;

/// The event loop the workers run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDriver {
    IoUring,
    Epoll,
}

impl IoDriver {
    pub fn name(self) -> &'static str {
        match self {
            IoDriver::IoUring => "io_uring",
            IoDriver::Epoll => "epoll",
        }
    }
}

/// What `--io-driver` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverChoice {
    /// io_uring when the kernel (and seccomp) allow it, epoll otherwise.
    Auto,
    /// io_uring or refuse to start.
    Uring,
    /// epoll, even where io_uring would work.
    Epoll,
}

/// Picks the driver. `auto` probes io_uring (Docker's default seccomp profile refuses
/// `io_uring_setup` with EPERM) and falls back to epoll, saying why.
pub fn choose_driver(choice: DriverChoice) -> Result<(IoDriver, Option<String>), String> {
    match choice {
        DriverChoice::Epoll => Ok((IoDriver::Epoll, None)),
        DriverChoice::Uring => match probe_uring() {
            Ok(()) => Ok((IoDriver::IoUring, None)),
            Err(e) => Err(format!("--io-driver uring: io_uring is not available here ({e}); use --io-driver epoll or auto")),
        },
        DriverChoice::Auto => match probe_uring() {
            Ok(()) => Ok((IoDriver::IoUring, None)),
            Err(e) => Ok((IoDriver::Epoll, Some(format!("io_uring is not available ({e}); falling back to epoll")))),
        },
    }
}

fn probe_uring() -> Result<(), String> {
    match io_uring_setup_probe() {
        Ok(()) if monoio::utils::detect_uring() => Ok(()),
        Ok(()) => Err("the kernel lacks io_uring operations monoio needs".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Tries to build an io_uring runtime, which reports the real errno (EPERM under seccomp,
/// ENOSYS on old kernels) rather than a bare yes/no.
fn io_uring_setup_probe() -> io::Result<()> {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(8)
        .build()
        .map(drop)
}
