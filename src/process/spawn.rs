//! The one `posix_spawn` of the server: the only unsafe code on the way to a child.
//!
//! Why not `std::process::Command`: the server blocks SIGTERM and SIGINT in every thread
//! (only the main thread's `sigwait` takes them), and a child inherits that mask, so a
//! child started through std ignored the contract's SIGTERM and SIGINT (measured: `SigBlk:
//! 0000000000004002` in the child). std offers no way to reset the mask without
//! `pre_exec`, and `pre_exec` turns the spawn into a full `fork`, which copies the
//! server's page tables. glibc's `posix_spawn` does all of it in the cheap `vfork`-style
//! child, in this order:
//!
//! 1. its own process group (`POSIX_SPAWN_SETPGROUP`, group = its pid);
//! 2. an empty signal mask and default dispositions (SIGPIPE is ignored by Rust);
//! 3. `fchdir` into the working directory descriptor, which was opened beneath the base
//!    directory, so a rename or symlink swap after the check cannot redirect it;
//! 4. stdin/stdout/stderr from the given pipes, or `/dev/null`;
//! 5. every other descriptor closed (`closefrom(3)`, or past the extra descriptors
//!    the caller passes on), as Python's `close_fds=True`: the server's sockets,
//!    io_uring rings and other children's pipes stay out of it;
//! 6. `execve` with exactly the environment given.
//!
//! The program is looked up on the child's `PATH` (Python does the same when `env` is
//! given) before spawning; a name with a slash is used as is, relative to the new
//! working directory.

#[cfg(not(target_env = "gnu"))]
compile_error!("agent-sandbox spawns children with glibc's posix_spawn extensions (addfchdir_np, addclosefrom_np, glibc 2.34+); build for a -gnu target");

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// `PATH` when the child's environment has none (Python's `os.defpath`).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The descriptors a child gets as 0, 1 and 2 (`None` is `/dev/null`), and any it gets
/// from 3 on, in order (the Python bridge's sockets).
#[derive(Default)]
pub struct Stdio<'a> {
    pub stdin: Option<BorrowedFd<'a>>,
    pub stdout: Option<BorrowedFd<'a>>,
    pub stderr: Option<BorrowedFd<'a>>,
    pub extra: Vec<BorrowedFd<'a>>,
    /// A terminal (a PTY's slave path) instead of the three above: the child starts a
    /// new session (`setsid`, so its process group is still its pid) and opens the
    /// terminal as 0, 1 and 2, which makes it the session's controlling terminal.
    pub terminal: Option<&'a std::ffi::CStr>,
}

fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or environment entry contains a NUL byte",
        )
    })
}

/// Where `program` is: itself when it names a path, else the first executable regular
/// file of that name on `path_var`. `NotFound` (or `PermissionDenied` when only
/// non-executable candidates exist), as `execvp` reports it. Relative `PATH` entries
/// (`.`, empty, `bin`) are looked up in the child's working directory `cwd`, where the
/// child will resolve them, and returned relative.
pub fn find_program(
    program: &str,
    path_var: Option<&OsStr>,
    cwd: BorrowedFd<'_>,
) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut denied = false;
    for dir in path_var.as_bytes().split(|b| *b == b':') {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(dir))
        };
        let candidate = dir.join(program);
        // A relative candidate is checked through the working directory's descriptor.
        let checked = if candidate.is_absolute() {
            candidate.clone()
        } else {
            Path::new(&format!("/proc/self/fd/{}", cwd.as_raw_fd())).join(&candidate)
        };
        match rustix::fs::stat(&checked) {
            Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() => {
                if rustix::fs::access(&checked, rustix::fs::Access::EXEC_OK).is_ok() {
                    return Ok(candidate);
                }
                denied = true;
            }
            _ => {}
        }
    }
    Err(io::Error::from_raw_os_error(if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
}

/// `ABX_CHILD_USER`: the user and group every child runs as, set once at startup.
static CHILD_USER: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// The first argument of the server binary when it runs as [`exec_as_child_user`].
pub const EXEC_AS: &str = "--exec-as-child-user";

/// Makes every later child run as `uid`/`gid` (the server must be root). posix_spawn
/// cannot change ids, so each child starts as the server's own binary in
/// [`exec_as_child_user`] mode, which drops to the user and then executes the program:
/// one extra `execve` per child, only with this setting.
pub fn set_child_user(uid: u32, gid: u32) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err(format!(
            "ABX_CHILD_USER={uid}:{gid} needs the server to run as root (it changes each child's user); unset it or start the server as root"
        ));
    }
    let _ = CHILD_USER.set((uid, gid));
    Ok(())
}

/// `ABX_CHILD_USER`'s user and group, when set: no child may run as another.
pub fn child_user() -> Option<(u32, u32)> {
    CHILD_USER.get().copied()
}

/// `agent-sandbox --exec-as-child-user UID GID PROGRAM ARGV...`: drops every group and
/// the user to `UID`/`GID`, then executes `PROGRAM` with `ARGV` and the environment as
/// given. Called by `main` before anything else; returns only with the error to print.
pub fn exec_as_child_user(args: &[OsString]) -> io::Error {
    let [uid, gid, program, argv @ ..] = args else {
        return io::Error::other("usage: --exec-as-child-user UID GID PROGRAM ARGV...");
    };
    let number = |v: &OsString| v.to_str().and_then(|s| s.parse::<u32>().ok());
    let (Some(uid), Some(gid)) = (number(uid), number(gid)) else {
        return io::Error::other("--exec-as-child-user: UID and GID must be numbers");
    };
    // SAFETY: plain system calls on this single-threaded process, which then execs.
    unsafe {
        if libc::setgroups(1, &gid) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
            return io::Error::last_os_error();
        }
        if libc::setuid(0) == 0 {
            return io::Error::other(
                "--exec-as-child-user: root could be regained; refusing to run",
            );
        }
    }
    use std::os::unix::process::CommandExt;
    std::process::Command::new(program)
        .arg0(argv.first().cloned().unwrap_or_else(|| program.clone()))
        .args(argv.iter().skip(1))
        .exec()
}

/// Starts `program` with `argv` and `env` as described in the module docs and returns
/// its pid. Blocking (briefly): run it on the blocking pool.
pub fn spawn(
    program: &Path,
    argv: &[String],
    env: &[(OsString, OsString)],
    cwd: BorrowedFd<'_>,
    stdio: Stdio<'_>,
    // The user and group to run as, for this child only; `ABX_CHILD_USER`'s otherwise.
    user: Option<(u32, u32)>,
) -> io::Result<i32> {
    let mut program = c_string(program.as_os_str().as_bytes())?;
    let mut argv: Vec<CString> = argv
        .iter()
        .map(|a| c_string(a.as_bytes()))
        .collect::<io::Result<_>>()?;
    if let Some((uid, gid)) = user.or(CHILD_USER.get().copied()) {
        let helper = c"/proc/self/exe".to_owned();
        let mut wrapped = vec![
            c"agent-sandbox".to_owned(),
            c_string(EXEC_AS.as_bytes())?,
            c_string(uid.to_string().as_bytes())?,
            c_string(gid.to_string().as_bytes())?,
            program,
        ];
        wrapped.append(&mut argv);
        argv = wrapped;
        program = helper;
    }
    let envp: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            let mut entry = k.clone().into_vec();
            entry.push(b'=');
            entry.extend_from_slice(v.as_bytes());
            c_string(&entry)
        })
        .collect::<io::Result<_>>()?;
    let mut argv_ptrs: Vec<*mut libc::c_char> = argv.iter().map(|a| a.as_ptr() as *mut _).collect();
    argv_ptrs.push(std::ptr::null_mut());
    let mut envp_ptrs: Vec<*mut libc::c_char> = envp.iter().map(|e| e.as_ptr() as *mut _).collect();
    envp_ptrs.push(std::ptr::null_mut());
    let dev_null = c"/dev/null";
    // An extra descriptor whose number lies in the target range 3..3+n could be
    // overwritten by an earlier dup2 before its own turn: move every source above the
    // range first (close-on-exec copies, closed again when this function returns).
    let first_free = 3 + stdio.extra.len() as i32;
    let extra: Vec<std::os::fd::OwnedFd> = stdio
        .extra
        .iter()
        .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, first_free).map_err(io::Error::from))
        .collect::<io::Result<_>>()?;

    let check = |rc: libc::c_int| -> io::Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(rc))
        }
    };
    // SAFETY: the attribute and file-action objects are initialised before use and
    // destroyed on every path (the guards); every pointer passed stays alive until
    // posix_spawn returns (the CStrings and pointer vectors above outlive the call).
    unsafe {
        let mut attr = std::mem::MaybeUninit::<libc::posix_spawnattr_t>::uninit();
        check(libc::posix_spawnattr_init(attr.as_mut_ptr()))?;
        let mut attr = AttrGuard(attr.assume_init());
        let mut actions = std::mem::MaybeUninit::<libc::posix_spawn_file_actions_t>::uninit();
        check(libc::posix_spawn_file_actions_init(actions.as_mut_ptr()))?;
        let mut actions = ActionsGuard(actions.assume_init());
        let attr_ptr: *mut libc::posix_spawnattr_t = &mut attr.0;
        let actions_ptr: *mut libc::posix_spawn_file_actions_t = &mut actions.0;

        // A session leader is also its process group's leader: group kills reach a
        // terminal's programs the same way.
        let group = if stdio.terminal.is_some() {
            libc::POSIX_SPAWN_SETSID as libc::c_int
        } else {
            libc::POSIX_SPAWN_SETPGROUP as libc::c_int
        };
        let flags = group | libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
        check(libc::posix_spawnattr_setflags(
            attr_ptr,
            flags as libc::c_short,
        ))?;
        if stdio.terminal.is_none() {
            check(libc::posix_spawnattr_setpgroup(attr_ptr, 0))?;
        }
        let mut empty = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(empty.as_mut_ptr());
        check(libc::posix_spawnattr_setsigmask(attr_ptr, empty.as_ptr()))?;
        check(libc::posix_spawnattr_setsigdefault(
            attr_ptr,
            &ignored_signals().0,
        ))?;

        // First, while the working directory's descriptor cannot yet have been replaced
        // by one of the dup2s below (its number may be a dup2 target).
        check(libc::posix_spawn_file_actions_addfchdir_np(
            actions_ptr,
            cwd.as_raw_fd(),
        ))?;
        if let Some(terminal) = stdio.terminal {
            // glibc runs setsid before the file actions, so this open (without
            // O_NOCTTY) gives the new session its controlling terminal.
            check(libc::posix_spawn_file_actions_addopen(
                actions_ptr,
                0,
                terminal.as_ptr(),
                libc::O_RDWR,
                0,
            ))?;
            check(libc::posix_spawn_file_actions_adddup2(actions_ptr, 0, 1))?;
            check(libc::posix_spawn_file_actions_adddup2(actions_ptr, 0, 2))?;
        }
        let stdio_sources = if stdio.terminal.is_some() {
            Vec::new()
        } else {
            vec![(0, stdio.stdin), (1, stdio.stdout), (2, stdio.stderr)]
        };
        for (target, source) in stdio_sources {
            match source {
                Some(fd) => check(libc::posix_spawn_file_actions_adddup2(
                    actions_ptr,
                    fd.as_raw_fd(),
                    target,
                ))?,
                None => check(libc::posix_spawn_file_actions_addopen(
                    actions_ptr,
                    target,
                    dev_null.as_ptr(),
                    libc::O_RDWR,
                    0,
                ))?,
            }
        }
        for (target, source) in (3..).zip(&extra) {
            check(libc::posix_spawn_file_actions_adddup2(
                actions_ptr,
                source.as_raw_fd(),
                target,
            ))?;
        }
        check(libc::posix_spawn_file_actions_addclosefrom_np(
            actions_ptr,
            first_free,
        ))?;

        let mut pid: libc::pid_t = 0;
        check(libc::posix_spawn(
            &mut pid,
            program.as_ptr(),
            actions_ptr,
            attr_ptr,
            argv_ptrs.as_ptr(),
            envp_ptrs.as_ptr(),
        ))?;
        Ok(pid)
    }
}

/// The signals this process ignores (SIG_IGN): Rust's SIGPIPE, and whatever the server
/// inherited ignored (`nohup` ignores SIGHUP). A child gets them back at their default.
/// Listing only these, not every signal, saves the spawned child one `sigaction` call
/// per signal (glibc resets caught signals by itself). Read once: the server changes no
/// disposition after startup.
fn ignored_signals() -> &'static SigSet {
    static IGNORED: std::sync::OnceLock<SigSet> = std::sync::OnceLock::new();
    IGNORED.get_or_init(|| {
        // SAFETY: sigemptyset/sigaddset initialise and fill a local set; sigaction with a
        // null new action only reads the current disposition.
        unsafe {
            let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(set.as_mut_ptr());
            let mut set = set.assume_init();
            for signal in 1..libc::SIGRTMIN() {
                let mut current = std::mem::MaybeUninit::<libc::sigaction>::uninit();
                if libc::sigaction(signal, std::ptr::null(), current.as_mut_ptr()) == 0
                    && current.assume_init().sa_sigaction == libc::SIG_IGN
                {
                    libc::sigaddset(&mut set, signal);
                }
            }
            libc::sigaddset(&mut set, libc::SIGPIPE);
            SigSet(set)
        }
    })
}

/// A signal set that can live in a `static` (it is only ever read after creation).
struct SigSet(libc::sigset_t);
// SAFETY: a sigset_t is plain data, never mutated after `ignored_signals` builds it.
unsafe impl Sync for SigSet {}
unsafe impl Send for SigSet {}

struct AttrGuard(libc::posix_spawnattr_t);
impl Drop for AttrGuard {
    fn drop(&mut self) {
        // SAFETY: initialised by posix_spawnattr_init and destroyed once, here.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

struct ActionsGuard(libc::posix_spawn_file_actions_t);
impl Drop for ActionsGuard {
    fn drop(&mut self) {
        // SAFETY: initialised by posix_spawn_file_actions_init and destroyed once, here.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_the_childs_path() {
        let root = std::fs::File::open("/").unwrap();
        let cwd = std::os::fd::AsFd::as_fd(&root);
        assert_eq!(
            find_program("sh", Some(OsStr::new("/nonexistent:/bin")), cwd).unwrap(),
            PathBuf::from("/bin/sh")
        );
        assert_eq!(
            find_program("./x", None, cwd).unwrap(),
            PathBuf::from("./x"),
            "a name with a slash is not searched"
        );
        let missing = find_program("no-such-program-here", None, cwd).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
        // /etc/passwd exists but is not executable.
        let denied = find_program("passwd", Some(OsStr::new("/etc")), cwd).unwrap_err();
        assert_eq!(denied.raw_os_error(), Some(libc::EACCES));
        // A relative entry is searched in the child's directory, not the server's.
        let usr = std::fs::File::open("/usr").unwrap();
        assert_eq!(
            find_program(
                "sh",
                Some(OsStr::new("bin")),
                std::os::fd::AsFd::as_fd(&usr)
            )
            .unwrap(),
            PathBuf::from("bin/sh")
        );
    }
}
