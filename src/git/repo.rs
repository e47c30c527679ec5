//! Running git for the dev tools without leaving the base directory and without running
//! any program a repository, its attributes or the environment names.
//!
//! Left to itself, git looks for `.git` in the working directory and then in every
//! parent, so a repository *above* the base directory answers `/git/status` with files a
//! `/download` refuses; it honours `core.worktree`, a `gitdir:` file and
//! `objects/info/alternates`, each of which may point anywhere; and it runs programs its
//! configuration names (`core.fsmonitor`, `filter.<driver>.clean`/`smudge`/`process`,
//! `diff.external`, `diff.<driver>.textconv`/`command`, pagers, hooks), configuration an
//! uploaded `.git/config`, an uploaded `~/.gitconfig` (the home directory is often the
//! base directory) or `GIT_CONFIG_*` variables can write.
//!
//! So, in order:
//! 1. [`discover`] walks from the caller's directory up to the base directory itself,
//!    never further, each step an `openat2(RESOLVE_BENEATH)` lookup: a `.git` that is a
//!    symlink out, a `gitdir:` file, a `commondir` file or an alternates entry that
//!    resolves outside is [`RepoError::Outside`]. The repository found is handed to git
//!    as `GIT_DIR` and `GIT_WORK_TREE`, so git discovers nothing and `core.worktree` is
//!    overridden.
//! 2. [`environment`] drops every `GIT_*` variable and every code-loading variable of
//!    the shared environment, ignores the global and system configuration, and forbids
//!    prompts and optional locks.
//! 3. [`config_overrides`] reads the repository's configuration with `git config --list`
//!    (which runs nothing) and answers `-c` overrides that blank every program-naming
//!    key it holds, plus fixed ones for the keys git would consult by default; command
//!    line `-c` outranks every configuration file (given as `GIT_CONFIG_KEY_n`, which has
//!    `-c`'s precedence without its `=` splitting). The dev tools also pass
//!    `--no-ext-diff`, `--no-textconv`, `--no-pager` and `--ignore-submodules=all` (a
//!    submodule has a configuration of its own). A configuration file whose text cannot
//!    hold a key to blank ([`config_names_no_program`]) needs no listing: its overrides
//!    are the fixed ones.
//!
//! Left: a directory renamed between [`discover`] and git's own lookups is read where it
//! then is (git opens paths by name); the caller can already write inside the base
//! directory, so this moves nothing outside it into reach except by that race.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::fs::base::{Beneath, CallerPath};
use crate::fs::resolve::OpenError;

/// A repository inside the base directory, as git will be told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    pub git_dir: PathBuf,
    pub work_tree: PathBuf,
}

#[derive(Debug)]
pub enum RepoError {
    /// No `.git` between the caller's directory and the base directory.
    NotARepository,
    /// Something the repository names lies outside the base directory (what, shown).
    Outside(String),
    Io(std::io::Error, String),
}

/// Finds the repository holding `start` without looking above the base directory.
/// Blocking (a few `openat2` calls and small reads).
pub fn discover(beneath: &Beneath<'_>, start: &CallerPath) -> Result<Repository, RepoError> {
    let mut rel = start.rel.clone();
    loop {
        let dot_git = rel.join(".git");
        match beneath.open(&dot_git, OFlags::PATH, Mode::empty()) {
            Ok(fd) => {
                let stat = rustix::fs::fstat(&fd)
                    .map_err(|e| RepoError::Io(e.into(), beneath.display(&dot_git)))?;
                let git_dir = if rustix::fs::FileType::from_raw_mode(stat.st_mode).is_dir() {
                    dot_git
                } else {
                    gitdir_file(beneath, &dot_git)?
                };
                check_common_dir(beneath, &git_dir)?;
                return Ok(Repository {
                    git_dir: beneath.base().path().join(&git_dir),
                    work_tree: beneath.base().path().join(&rel),
                });
            }
            Err(OpenError::Escape) => {
                return Err(RepoError::Outside(beneath.display(&dot_git)));
            }
            Err(e) if e.is_missing() => {}
            Err(OpenError::Io(e)) => return Err(RepoError::Io(e, beneath.display(&dot_git))),
        }
        if !rel.pop() {
            return Err(RepoError::NotARepository);
        }
    }
}

/// A `.git` file (`gitdir: <path>`, as worktrees and submodules have): the directory it
/// names, relative to the base, if it lies beneath it.
fn gitdir_file(beneath: &Beneath<'_>, dot_git: &Path) -> Result<PathBuf, RepoError> {
    let text = read_small(beneath, dot_git)?;
    let named = text
        .lines()
        .find_map(|l| l.strip_prefix("gitdir:"))
        .map(str::trim)
        .ok_or_else(|| {
            RepoError::Io(
                std::io::Error::other("a .git file without a gitdir: line"),
                beneath.display(dot_git),
            )
        })?;
    let holder = dot_git.parent().unwrap_or(Path::new(""));
    resolve_named(beneath, holder, named)
}

/// A worktree's git directory names its common directory in `commondir`, and any object
/// directory may name others in `objects/info/alternates`: each must lie beneath.
fn check_common_dir(beneath: &Beneath<'_>, git_dir: &Path) -> Result<(), RepoError> {
    let mut common = git_dir.to_path_buf();
    let commondir = git_dir.join("commondir");
    if exists(beneath, &commondir)? {
        let text = read_small(beneath, &commondir)?;
        common = resolve_named(beneath, git_dir, text.trim())?;
    }
    for dir in [git_dir.to_path_buf(), common] {
        check_alternates(beneath, &dir.join("objects"), 0)?;
    }
    Ok(())
}

/// An object directory's `info/alternates`, and theirs in turn (git follows them five
/// deep): every entry must lie beneath the base. A quoted entry (git unquotes C-style
/// escapes) is refused rather than unquoted here.
fn check_alternates(beneath: &Beneath<'_>, objects: &Path, depth: usize) -> Result<(), RepoError> {
    let alternates = objects.join("info/alternates");
    if !exists(beneath, &alternates)? {
        return Ok(());
    }
    if depth > 5 {
        return Err(RepoError::Outside(beneath.display(&alternates)));
    }
    for line in read_small(beneath, &alternates)?.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('"') {
            return Err(RepoError::Outside(beneath.display(&alternates)));
        }
        let next = resolve_named(beneath, objects, line)?;
        check_alternates(beneath, &next, depth + 1)?;
    }
    Ok(())
}

/// `named` (absolute, or relative to the directory `holder`), as a path relative to the
/// base, once it is shown to resolve beneath it.
fn resolve_named(beneath: &Beneath<'_>, holder: &Path, named: &str) -> Result<PathBuf, RepoError> {
    let base = beneath.base().path();
    let absolute = if named.starts_with('/') {
        PathBuf::from(named)
    } else {
        base.join(holder).join(named)
    };
    let outside = || RepoError::Outside(absolute.display().to_string());
    let confined = beneath
        .base()
        .confine(&absolute.to_string_lossy())
        .map_err(|_| outside())?;
    match beneath.open(&confined.rel, OFlags::PATH, Mode::empty()) {
        Ok(_) => Ok(confined.rel),
        Err(OpenError::Escape) => Err(outside()),
        Err(OpenError::Io(e)) => Err(RepoError::Io(e, absolute.display().to_string())),
    }
}

fn exists(beneath: &Beneath<'_>, rel: &Path) -> Result<bool, RepoError> {
    match beneath.open(rel, OFlags::PATH, Mode::empty()) {
        Ok(_) => Ok(true),
        Err(e) if e.is_missing() => Ok(false),
        Err(OpenError::Escape) => Err(RepoError::Outside(beneath.display(rel))),
        Err(OpenError::Io(e)) => Err(RepoError::Io(e, beneath.display(rel))),
    }
}

/// A small text file beneath the base (at most 64 KiB are read).
fn read_small(beneath: &Beneath<'_>, rel: &Path) -> Result<String, RepoError> {
    let shown = || beneath.display(rel);
    let fd = beneath
        .open(rel, OFlags::RDONLY | OFlags::NOFOLLOW, Mode::empty())
        .map_err(|e| match e {
            OpenError::Escape => RepoError::Outside(shown()),
            OpenError::Io(e) => RepoError::Io(e, shown()),
        })?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = rustix::io::read(&fd, &mut buf).map_err(|e| RepoError::Io(e.into(), shown()))?;
    buf.truncate(n);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The environment git runs with: the shared one without any `GIT_*` or code-loading
/// variable, the repository named explicitly, no global or system configuration.
pub fn environment(
    shared: &[(OsString, OsString)],
    repo: Option<&Repository>,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = shared
        .iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            !name.to_ascii_uppercase().starts_with("GIT_")
                && !crate::process::env::loads_code(&name)
        })
        .cloned()
        .collect();
    let mut set = |name: &str, value: &std::ffi::OsStr| env.push((name.into(), value.into()));
    set("GIT_CONFIG_NOSYSTEM", "1".as_ref());
    set("GIT_CONFIG_GLOBAL", "/dev/null".as_ref());
    set("GIT_TERMINAL_PROMPT", "0".as_ref());
    set("GIT_OPTIONAL_LOCKS", "0".as_ref());
    set("LC_ALL", "C".as_ref());
    // Never fetch a missing object (a "partial clone"'s promisor remote).
    set("GIT_NO_LAZY_FETCH", "1".as_ref());
    if let Some(repo) = repo {
        set("GIT_DIR", repo.git_dir.as_os_str());
        set("GIT_WORK_TREE", repo.work_tree.as_os_str());
    }
    env
}

/// Overrides every dev-tools git run carries, whatever the configuration says.
pub const FIXED_OVERRIDES: [(&str, &str); 13] = [
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("core.sshCommand", "false"),
    ("core.gitProxy", ""),
    ("core.askPass", ""),
    ("core.attributesFile", "/dev/null"),
    ("diff.external", ""),
    ("credential.helper", ""),
    ("submodule.recurse", "false"),
    ("status.submoduleSummary", "false"),
    // No transport at all: a "partial clone" would fetch missing objects through a
    // remote whose upload-pack command the repository names.
    ("protocol.allow", "never"),
];

/// [`FIXED_OVERRIDES`] as pairs to add to.
pub fn fixed_overrides() -> Vec<(String, String)> {
    FIXED_OVERRIDES
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Why a repository's configuration cannot be neutralised, so git must not run on it.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigRefusal {
    /// A key that is not UTF-8 cannot be named back exactly.
    NotUtf8,
    /// The listing was cut: keys past the cut would go unseen.
    TooLarge,
}

/// The overrides for `git`, as `(key, value)` pairs that [`environment`] passes as
/// `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` (the same precedence as
/// `-c`, and no `=` splitting: a driver named `a=b` is named exactly):
/// [`FIXED_OVERRIDES`], then a blank for every key of `config_list` (the NUL-separated
/// output of `git config --null --list`) that names a program to run. A blank command
/// is one git skips (`filter.<d>.required` is lifted too, or a blanked filter would
/// fail the operation).
pub fn config_overrides(
    config_list: &str,
    truncated: bool,
) -> Result<Vec<(String, String)>, ConfigRefusal> {
    if truncated {
        return Err(ConfigRefusal::TooLarge);
    }
    if config_list.contains('\u{FFFD}') {
        return Err(ConfigRefusal::NotUtf8);
    }
    let mut pairs = fixed_overrides();
    for entry in config_list.split('\0') {
        let key = entry.split('\n').next().unwrap_or_default();
        let lower = key.to_ascii_lowercase();
        let Some((section, name)) = lower.split_once('.') else {
            continue;
        };
        let variable = name.rsplit('.').next().unwrap_or_default();
        let blank = match section {
            "filter" => matches!(variable, "clean" | "smudge" | "process"),
            "diff" => matches!(variable, "textconv" | "command"),
            "merge" => variable == "driver",
            "pager" | "alias" => true,
            "gpg" => variable == "program",
            "remote" => matches!(variable, "uploadpack" | "receivepack" | "vcs"),
            _ => false,
        };
        if blank {
            pairs.push((key.to_string(), String::new()));
        }
        if section == "filter" && variable == "required" {
            pairs.push((key.to_string(), "false".to_string()));
        }
    }
    Ok(pairs)
}

/// Words whose presence (in any case, anywhere) in a configuration file sends it to
/// `git config --list`: the sections [`config_overrides`] blanks keys of, and what makes
/// git read more configuration (`include.path`, `includeIf.*`, a worktree's
/// `config.worktree`).
const NAMES_PROGRAMS_OR_INCLUDES: [&str; 9] = [
    "filter", "diff", "merge", "pager", "alias", "gpg", "remote", "include", "worktree",
];

/// Whether the repository's configuration, read as text, can hold nothing that
/// [`config_overrides`] would refuse or blank: then the overrides are exactly
/// [`FIXED_OVERRIDES`] and running `git config --list` (a process of its own, about as
/// long as the `git status` it prepares) can be skipped.
///
/// Conservative: a section name is plain ASCII in a header (`[filter "x"]` or
/// `[filter.x]`, any case), so a file without any word of
/// [`NAMES_PROGRAMS_OR_INCLUDES`] has no key of those sections and includes nothing,
/// and git (with no system or global configuration) reads no other file. Anything
/// else answers `false`: a linked worktree (`commondir`), a file that cannot be read
/// beneath the base (a symlink included), one over 64 KiB, not UTF-8, holding U+FFFD
/// (which [`config_overrides`] refuses), or whose listing could pass its 1 MiB cut. A
/// missing file is an empty configuration. Blocking (one small read).
pub fn config_names_no_program(beneath: &Beneath<'_>, repo: &Repository) -> bool {
    let Ok(git_dir) = repo.git_dir.strip_prefix(beneath.base().path()) else {
        return false;
    };
    if !matches!(exists(beneath, &git_dir.join("commondir")), Ok(false)) {
        return false;
    }
    let fd = match beneath.open(
        &git_dir.join("config"),
        OFlags::RDONLY | OFlags::NOFOLLOW,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) if e.is_missing() => return true,
        Err(_) => return false,
    };
    const MAX: usize = 64 * 1024;
    let mut text = vec![0u8; MAX + 1];
    let mut len = 0;
    while len < text.len() {
        match rustix::io::read(&fd, &mut text[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
    if len > MAX {
        return false;
    }
    let Ok(text) = std::str::from_utf8(&text[..len]) else {
        return false;
    };
    text_names_no_program(text)
}

/// [`config_names_no_program`]'s judgement of the file's text.
fn text_names_no_program(text: &str) -> bool {
    if text.contains('\u{FFFD}') {
        return false;
    }
    let lower = text.to_ascii_lowercase();
    if NAMES_PROGRAMS_OR_INCLUDES
        .iter()
        .any(|word| lower.contains(word))
    {
        return false;
    }
    // The listing repeats each entry's section: bound it as git would print it.
    let mut section = 0usize;
    let mut listed = 0usize;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.len();
        } else if !line.is_empty() {
            listed += section + line.len() + 2;
        }
    }
    listed <= 1024 * 1024
}

/// Adds `pairs` to `env` as command-line-scope configuration.
pub fn add_overrides(env: &mut Vec<(OsString, OsString)>, pairs: &[(String, String)]) {
    env.push(("GIT_CONFIG_COUNT".into(), pairs.len().to_string().into()));
    for (n, (key, value)) in pairs.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{n}").into(), key.into()));
        env.push((format!("GIT_CONFIG_VALUE_{n}").into(), value.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_without_program_sections_needs_no_listing() {
        let plain = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n[user]\n\tname = Sandbox\n\temail = s@example.com\n[init]\n\tdefaultBranch = main\n";
        assert!(text_names_no_program(plain));
        assert!(text_names_no_program(""));
        for text in [
            "[filter \"lfs\"]\n\tclean = git-lfs clean -- %f\n",
            "[FiLtEr.x]\nclean = run\n",
            "[core]\n[diff \"pdf\"]\ntextconv = run\n",
            "[remote \"origin\"]\nuploadpack = run\n",
            "[alias]\nst = status\n",
            "[pager]\nstatus = run\n",
            "[gpg]\nprogram = run\n",
            "[merge \"x\"]\ndriver = run\n",
            "[include]\npath = elsewhere\n",
            "[includeIf \"gitdir:/x\"]\npath = elsewhere\n",
            "[extensions]\nworktreeConfig = true\n",
            "[user]\nname = \u{FFFD}\n",
        ] {
            assert!(!text_names_no_program(text), "{text}");
        }
        // Every section config_overrides blanks a key of is one of the words.
        let listing = "filter.a.clean\nx\0diff.a.textconv\nx\0merge.a.driver\nx\0pager.status\nx\0alias.st\nx\0gpg.program\nx\0remote.o.vcs\nx\0";
        for (key, _) in config_overrides(listing, false)
            .unwrap()
            .iter()
            .skip(FIXED_OVERRIDES.len())
        {
            let section = key.split('.').next().unwrap().to_ascii_lowercase();
            assert!(
                NAMES_PROGRAMS_OR_INCLUDES.contains(&section.as_str()),
                "{key}"
            );
        }
        // A listing that could pass the 1 MiB cut is left to git.
        let long = format!("[{}]\n{}", "a".repeat(4000), "b = c\n".repeat(300));
        assert!(!text_names_no_program(&long));
    }

    #[test]
    fn every_program_naming_key_is_blanked() {
        let list = "core.bare\nfalse\0filter.Evil.clean\ntouch /tmp/x\0filter.Evil.required\ntrue\0diff.pdf.textconv\npdftotext\0diff.x.command\nrun\0user.name\nme\0pager.status\nless\0filter.a=b.clean\nrun\0remote.origin.uploadpack\nrun\0";
        let pairs = config_overrides(list, false).unwrap();
        let has = |k: &str, v: &str| pairs.iter().any(|(pk, pv)| pk == k && pv == v);
        for (key, value) in [
            ("filter.Evil.clean", ""),
            ("filter.Evil.required", "false"),
            ("diff.pdf.textconv", ""),
            ("diff.x.command", ""),
            ("pager.status", ""),
            ("filter.a=b.clean", ""),
            ("remote.origin.uploadpack", ""),
            ("core.fsmonitor", "false"),
            ("protocol.allow", "never"),
        ] {
            assert!(has(key, value), "{key}: {pairs:?}");
        }
        assert!(
            !pairs.iter().any(|(k, _)| k.starts_with("user.name")),
            "{pairs:?}"
        );
        assert_eq!(
            config_overrides("filter.\u{FFFD}.clean\nx\0", false),
            Err(ConfigRefusal::NotUtf8)
        );
        assert_eq!(config_overrides("", true), Err(ConfigRefusal::TooLarge));
        let mut env = Vec::new();
        add_overrides(&mut env, &pairs[..1]);
        assert_eq!(env[0], ("GIT_CONFIG_COUNT".into(), "1".into()));
        assert_eq!(env[1], ("GIT_CONFIG_KEY_0".into(), "core.fsmonitor".into()));
    }

    #[test]
    fn the_environment_keeps_no_git_or_loader_variable() {
        let shared: Vec<(OsString, OsString)> = [
            ("PATH", "/bin"),
            ("GIT_DIR", "/elsewhere"),
            ("GIT_CONFIG_COUNT", "1"),
            ("git_config_key_0", "core.fsmonitor"),
            ("LD_PRELOAD", "/x.so"),
        ]
        .iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        let env = environment(&shared, None);
        let names: Vec<String> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into())
            .collect();
        assert!(names.contains(&"PATH".to_string()));
        for gone in [
            "GIT_DIR",
            "GIT_CONFIG_COUNT",
            "git_config_key_0",
            "LD_PRELOAD",
        ] {
            assert!(!names.contains(&gone.to_string()), "{gone}: {names:?}");
        }
        assert!(env
            .iter()
            .any(|(k, v)| k == "GIT_CONFIG_GLOBAL" && v == "/dev/null"));
    }
}
