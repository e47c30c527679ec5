//! The choice of I/O driver. Its own module, not `runtime`'s root: [`super::file`] opens
//! files for the driver in use, and the root re-exports `file`.

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
    // Honoured as monoio's own `detect_uring` honours it.
    if std::env::var("MONOIO_FORCE_LEGACY_DRIVER")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
    {
        return Err("MONOIO_FORCE_LEGACY_DRIVER is set".into());
    }
    // One small ring asked which operations it has: `io_uring_setup` reports the real
    // errno (EPERM under seccomp, ENOSYS on old kernels), `io_uring_register` is the
    // probe. Building a monoio runtime and then monoio's `detect_uring` made two rings,
    // an eventfd and a runtime to throw away: 0.21-0.27 ms of start, against 0.12-0.17
    // for this (docs/benchmarks.md, "Sixth session").
    let ring = io_uring::IoUring::new(2).map_err(|e| e.to_string())?;
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| e.to_string())?;
    if MONOIO_OPS.iter().all(|op| probe.is_supported(*op)) {
        Ok(())
    } else {
        Err("the kernel lacks io_uring operations monoio needs".into())
    }
}

/// The operations monoio 0.2's io_uring driver submits (its `detect_uring` list, for
/// the features this build enables).
const MONOIO_OPS: [u8; 17] = {
    use io_uring::opcode::*;
    [
        Accept::CODE,
        AsyncCancel::CODE,
        Close::CODE,
        Connect::CODE,
        Fsync::CODE,
        OpenAt::CODE,
        PollAdd::CODE,
        ProvideBuffers::CODE,
        Read::CODE,
        Readv::CODE,
        Recv::CODE,
        Send::CODE,
        SendMsg::CODE,
        RecvMsg::CODE,
        Timeout::CODE,
        Write::CODE,
        Writev::CODE,
    ]
};
