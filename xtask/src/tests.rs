//! End-to-end tests of fetch, verify, patch and export against fake hosts: temporary git
//! repositories and archives, never the network.

use std::path::{Path, PathBuf};
use std::process::Command;

use xshell::Shell;

use crate::config::{HostConfig, Matrix, Toolchains};
use crate::project::Project;
use crate::treehash::{file_sha256, tree_hash};
use crate::{ci, host, patch};

fn git_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

struct Fixture {
    _tmp: tempfile::TempDir,
    tmp: PathBuf,
    project: Project,
    upstream: PathBuf,
    rev: String,
    hash: String,
}

const HOST: &str = "fake";

impl Fixture {
    /// A fake upstream git repository and a project whose host `fake` pins it.
    fn new() -> Fixture {
        let tmp_dir = tempfile::tempdir().unwrap();
        let tmp = tmp_dir.path().to_path_buf();
        let upstream = tmp.join("upstream");
        write(&upstream.join("CMakeLists.txt"), "project(fake C)\n");
        write(
            &upstream.join("src/engine.c"),
            "int engine(void) {\n    return 1;\n}\n\nint other(void) {\n    return 2;\n}\n",
        );
        write(&upstream.join("src/README"), "fake host\n");
        git_in(&upstream, &["init", "-q", "-b", "main"]);
        git_in(&upstream, &["add", "-A"]);
        git_in(&upstream, &["commit", "-q", "-m", "upstream"]);
        let rev = git_in(&upstream, &["rev-parse", "HEAD"]);
        let hash = tree_hash(&upstream).unwrap().digest;

        let root = tmp.join("project");
        write(&root.join("overlay/CMakeLists.txt"), "# overlay\n");
        write(&root.join("patches/fake/series"), "");
        let fixture = Fixture {
            _tmp: tmp_dir,
            tmp,
            project: Project { root },
            upstream,
            rev,
            hash,
        };
        fixture.write_host(
            &format!("file://{}", fixture.upstream.display()),
            &fixture.rev,
            &fixture.hash,
            "",
        );
        fixture
    }

    fn write_host(&self, upstream: &str, rev: &str, tree_hash: &str, extra: &str) {
        let text = format!(
            r#"
name = "fake"
upstream = "{upstream}"
rev = "{rev}"
tree_hash = "{tree_hash}"
mount = "src/flashrt"
{extra}
[cmake]
flashrt_option = "FLASHRT"
arch_option = "CMAKE_CUDA_ARCHITECTURES"
defaults = {{}}
cuda = {{}}
cpu = {{}}
[build]
targets = ["fake"]
overlay_target = "fake-overlay"
default_archs = ["90a"]
"#
        );
        write(&self.project.host_config_path(HOST), &text);
    }

    fn host(&self) -> HostConfig {
        self.project.host(HOST).unwrap()
    }

    fn tree(&self) -> PathBuf {
        self.project.tree_dir(HOST)
    }

    /// A .tar.gz like the PyPI sdist: the host tree below `fake-1.0/vendor/host`. Returns its sha256.
    fn make_archive(&self, name: &str) -> (PathBuf, String) {
        let staging = self.tmp.join("staging");
        let inner = staging.join("fake-1.0/vendor/host");
        crate::fsutil::copy_tree(&self.upstream, &inner, &|rel| {
            rel.file_name().is_some_and(|n| n == ".git")
        })
        .unwrap();
        // The sdist carries the submodule's gitlink file; it is not part of the tree.
        write(
            &inner.join(".git"),
            "gitdir: ../../.git/modules/vendor/host\n",
        );
        let archive = self.tmp.join(name);
        let status = Command::new("tar")
            .arg("-czf")
            .arg(&archive)
            .arg("-C")
            .arg(&staging)
            .arg("fake-1.0")
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::remove_dir_all(&staging).unwrap();
        let sha = file_sha256(&archive).unwrap();
        (archive, sha)
    }

    fn mirror_section(sha: &str) -> String {
        format!(
            "[mirror]\nkind = \"pypi-sdist\"\npackage = \"fake\"\nversion = \"1.0\"\nfile = \"fake-1.0.tar.gz\"\n\
             sha256 = \"{sha}\"\nsubdir = \"fake-1.0/vendor/host\"\n"
        )
    }

    /// Commits a change to src/engine.c in the working tree and exports it as the series.
    fn author_patch(&self, sh: &Shell) {
        patch::ensure_patched(sh, &self.project, &self.host(), None, false).unwrap();
        let tree = self.tree();
        let engine = tree.join("src/engine.c");
        let text = std::fs::read_to_string(&engine)
            .unwrap()
            .replace("return 1;", "return 42;");
        std::fs::write(&engine, text).unwrap();
        git_in(
            &tree,
            &[
                "commit",
                "-q",
                "-a",
                "-m",
                "engine: answer 42\n\nWhy: tests.",
            ],
        );
        patch::run(
            sh,
            &self.project,
            patch::PatchArgs {
                command: patch::PatchCommand::Export {
                    select: host::HostSelect { host: HOST.into() },
                    force: false,
                },
            },
        )
        .unwrap();
    }
}

fn err_text<T: std::fmt::Debug>(result: anyhow::Result<T>) -> String {
    format!("{:#}", result.unwrap_err())
}

#[test]
fn fetches_from_git_verifies_and_caches() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), None).unwrap();
    assert!(stamp.verified);
    assert_eq!(stamp.tree_hash, f.hash);
    assert!(stamp.source.starts_with("git "));
    let pristine = f.project.pristine_dir(HOST);
    assert_eq!(tree_hash(&pristine).unwrap().digest, f.hash);
    assert!(!pristine.join(".git").exists());

    // The cache answers without the upstream.
    std::fs::remove_dir_all(&f.upstream).unwrap();
    let again = host::ensure_pristine(&sh, &f.project, &f.host(), None).unwrap();
    assert_eq!(again, stamp);
}

#[test]
fn wrong_tree_hash_names_both_values_and_changes_nothing() {
    let f = Fixture::new();
    let wrong = format!("sha256:{}", "0".repeat(64));
    f.write_host(
        &format!("file://{}", f.upstream.display()),
        &f.rev,
        &wrong,
        "",
    );
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(err.contains(&wrong) && err.contains(&f.hash), "{err}");
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn unknown_rev_is_reported() {
    let f = Fixture::new();
    let missing = "1234567890123456789012345678901234567890";
    f.write_host(
        &format!("file://{}", f.upstream.display()),
        missing,
        &f.hash,
        "",
    );
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(err.contains(missing), "{err}");
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn host_src_with_local_edits_is_refused_with_the_files_listed() {
    let f = Fixture::new();
    std::fs::write(f.upstream.join("src/README"), "edited\n").unwrap();
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(
        &sh,
        &f.project,
        &f.host(),
        Some(&f.upstream),
    ));
    assert!(
        err.contains("tree hash mismatch") && err.contains("src/README"),
        "{err}"
    );
    assert!(!f.project.pristine_dir(HOST).exists());

    // Undone, the same checkout is accepted.
    git_in(&f.upstream, &["checkout", "--", "src/README"]);
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), Some(&f.upstream)).unwrap();
    assert!(stamp.verified && stamp.source.starts_with("local directory"));
}

#[test]
fn mirror_archive_is_used_when_git_fails() {
    let f = Fixture::new();
    let (archive, sha) = f.make_archive("fake-1.0.tar.gz");
    let downloads = f.project.downloads();
    std::fs::create_dir_all(&downloads).unwrap();
    std::fs::copy(&archive, downloads.join("fake-1.0.tar.gz")).unwrap();
    let gone = format!("file://{}", f.tmp.join("no-such-repo").display());
    f.write_host(&gone, &f.rev, &f.hash, &Fixture::mirror_section(&sha));
    let sh = Shell::new().unwrap();
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), None).unwrap();
    assert!(stamp.source.contains("fake==1.0"), "{}", stamp.source);
    assert_eq!(
        tree_hash(&f.project.pristine_dir(HOST)).unwrap().digest,
        f.hash
    );
}

#[test]
fn corrupt_mirror_archive_is_removed_and_reported() {
    let f = Fixture::new();
    let (archive, sha) = f.make_archive("fake-1.0.tar.gz");
    let downloads = f.project.downloads();
    std::fs::create_dir_all(&downloads).unwrap();
    let mut bytes = std::fs::read(&archive).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(downloads.join("fake-1.0.tar.gz"), &bytes).unwrap();
    let gone = format!("file://{}", f.tmp.join("no-such-repo").display());
    f.write_host(&gone, &f.rev, &f.hash, &Fixture::mirror_section(&sha));
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(err.contains("corrupt") && err.contains(&sha), "{err}");
    assert!(!downloads.join("fake-1.0.tar.gz").exists());
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn truncated_archive_fails_extraction_cleanly() {
    let f = Fixture::new();
    let (archive, _) = f.make_archive("full.tar.gz");
    let bytes = std::fs::read(&archive).unwrap();
    // Pinned to the truncated bytes: the checksum passes and extraction must fail.
    let truncated = &bytes[..bytes.len() / 2];
    let downloads = f.project.downloads();
    std::fs::create_dir_all(&downloads).unwrap();
    std::fs::write(downloads.join("fake-1.0.tar.gz"), truncated).unwrap();
    let sha = file_sha256(&downloads.join("fake-1.0.tar.gz")).unwrap();
    let gone = format!("file://{}", f.tmp.join("no-such-repo").display());
    f.write_host(&gone, &f.rev, &f.hash, &Fixture::mirror_section(&sha));
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(
        err.contains("truncated") || err.contains("tree hash mismatch"),
        "{err}"
    );
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn unpinned_host_without_source_explains_what_to_provide() {
    let f = Fixture::new();
    let text = "name = \"fake\"\nupstream = \"https://example.invalid/fake\"\nmount = \"m\"\n\
                note = \"Pass your checkout with --host-src DIR.\"\n\
                [cmake]\nflashrt_option = \"F\"\narch_option = \"A\"\ndefaults = {}\ncuda = {}\ncpu = {}\n\
                [build]\ntargets = []\noverlay_target = \"o\"\ndefault_archs = []\n";
    write(&f.project.host_config_path(HOST), text);
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(
        err.contains("no source for host fake") && err.contains("--host-src"),
        "{err}"
    );
    // build checks this before looking for any tool.
    let early = err_text(host::require_some_source(&f.project, &f.host(), None));
    assert_eq!(early, err);
    host::require_some_source(&f.project, &f.host(), Some(&f.upstream)).unwrap();
}

#[test]
fn export_then_check_reproduces_byte_for_byte() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let series = patch::load_series(&f.project, HOST).unwrap();
    assert_eq!(series.patches, ["0001-engine-answer-42.patch"]);
    let text = std::fs::read_to_string(series.dir.join(&series.patches[0])).unwrap();
    assert!(
        text.starts_with("From 0000000000000000000000000000000000000000 "),
        "{text}"
    );
    assert!(
        text.contains("Why: tests.") && text.contains("+    return 42;"),
        "{text}"
    );

    patch::check(&sh, &f.project, &f.host(), None).unwrap();

    // A committed patch that applies but is not what the export produces is caught: here, a
    // hand-written diffstat (git am ignores it; the export has none).
    let edited = text.replacen("diff --git", "---\n src/engine.c | 2 +-\n\ndiff --git", 1);
    std::fs::write(series.dir.join(&series.patches[0]), edited).unwrap();
    let err = err_text(patch::check(&sh, &f.project, &f.host(), None));
    assert!(
        err.contains("0001-engine-answer-42.patch: differs"),
        "{err}"
    );
}

#[test]
fn apply_is_idempotent_and_mounts_the_overlay() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    let head = git_in(&tree, &["rev-parse", "HEAD"]);
    let engine_mtime = std::fs::metadata(tree.join("src/engine.c"))
        .unwrap()
        .modified()
        .unwrap();
    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), head);
    assert_eq!(
        std::fs::metadata(tree.join("src/engine.c"))
            .unwrap()
            .modified()
            .unwrap(),
        engine_mtime
    );
    assert_eq!(
        std::fs::read_link(tree.join("src/flashrt")).unwrap(),
        f.project.overlay_dir()
    );
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 42;"));
    assert_eq!(git_in(&tree, &["status", "--porcelain"]), "");
}

#[test]
fn conflicting_patch_names_patch_and_file_and_leaves_tree_pristine() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    // Make the series no longer fit: its context line changes.
    let series = patch::load_series(&f.project, HOST).unwrap();
    let path = series.dir.join(&series.patches[0]);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(" int engine(void) {", " int engine(int x) {");
    std::fs::write(&path, text).unwrap();

    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("0001-engine-answer-42.patch") && err.contains("src/engine.c"),
        "{err}"
    );
    let tree = f.tree();
    assert_eq!(
        git_in(&tree, &["rev-parse", "HEAD"]),
        git_in(&tree, &["rev-parse", "flashrt-pristine"])
    );
    assert_eq!(git_in(&tree, &["status", "--porcelain"]), "");
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 1;"));
}

#[test]
fn local_edits_are_refused_unless_forced() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = f.tree();
    std::fs::write(tree.join("src/README"), "local edit\n").unwrap();
    std::fs::write(tree.join("scratch.txt"), "new file\n").unwrap();
    // The series changes, so the tree must be re-applied, which would lose the edits.
    std::fs::write(
        patch::load_series(&f.project, HOST)
            .unwrap()
            .dir
            .join("series"),
        "",
    )
    .unwrap();

    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("src/README") && err.contains("scratch.txt") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("src/README")).unwrap(),
        "local edit\n"
    );

    patch::ensure_patched(&sh, &f.project, &f.host(), None, true).unwrap();
    assert_eq!(
        std::fs::read_to_string(tree.join("src/README")).unwrap(),
        "fake host\n"
    );
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 1;"));
}

#[test]
fn unexported_commits_are_refused_until_exported() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = f.tree();
    std::fs::write(tree.join("src/README"), "second change\n").unwrap();
    git_in(
        &tree,
        &["commit", "-q", "-a", "-m", "readme: second change"],
    );
    // Touch the series so that the tree counts as out of date.
    let series_file = f.project.patches_dir(HOST).join("series");
    let text = std::fs::read_to_string(&series_file).unwrap();
    std::fs::write(&series_file, format!("# ordered\n{text}")).unwrap();

    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("commits that are not in the series") && err.contains("patch export"),
        "{err}"
    );

    patch::run(
        &sh,
        &f.project,
        patch::PatchArgs {
            command: patch::PatchCommand::Export {
                select: host::HostSelect { host: HOST.into() },
                force: false,
            },
        },
    )
    .unwrap();
    assert_eq!(
        patch::load_series(&f.project, HOST).unwrap().patches.len(),
        2
    );
    let head = git_in(&tree, &["rev-parse", "HEAD"]);
    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), head);
    patch::check(&sh, &f.project, &f.host(), None).unwrap();
}

#[test]
fn interrupted_apply_resumes() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = f.tree();
    // As if killed mid-apply: the stamp says "applying", the tree is at the pristine commit.
    let stamp = f.project.host_work(HOST).join("src.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stamp).unwrap()).unwrap();
    value["series"] = serde_json::Value::Null;
    value["head"] = serde_json::Value::Null;
    std::fs::write(&stamp, value.to_string()).unwrap();
    git_in(&tree, &["reset", "-q", "--hard", "flashrt-pristine"]);

    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 42;"));
}

#[test]
fn the_repository_config_files_load() {
    let project = Project {
        root: Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf(),
    };
    let names = project.host_names().unwrap();
    assert!(
        names.contains(&"llama.cpp".to_owned()) && names.contains(&"jetson-pi-edge".to_owned())
    );
    for name in &names {
        project.host(name).unwrap();
    }
    let llama = project.host("llama.cpp").unwrap();
    assert_eq!(
        llama.rev.as_deref(),
        Some("0c1e57098bba43ac29e6e3b677cdceebdd22334f")
    );
    assert!(llama.tree_hash.is_some() && llama.mirror.is_some());
    let jetson = project.host("jetson-pi-edge").unwrap();
    assert!(jetson.rev.is_none() && jetson.tree_hash.is_none() && jetson.note.is_some());

    let series = patch::load_series(&project, "llama.cpp").unwrap();
    assert!(!series.patches.is_empty());
    assert!(patch::load_series(&project, "jetson-pi-edge").is_err());

    Toolchains::load(&project.root.join("toolchains.toml")).unwrap();
    let matrix = Matrix::load(&project.root.join("ci/matrix.toml")).unwrap();
    let cells = ci::expand(&matrix);
    for arch in ["90a", "100a", "110a", "120a"] {
        let name = format!("llama.cpp/compile-only/sm_{arch}/flashrt");
        assert!(cells.iter().any(|c| c.name == name), "missing cell {name}");
    }
}

#[test]
fn scratch_left_by_an_interrupted_run_is_removed() {
    let f = Fixture::new();
    let tmp = f.project.work().join("tmp");
    // pid_max is at most 2^22 on Linux: this process cannot exist.
    let abandoned = tmp.join("scratch-99999999-abc");
    let ours = tmp.join(format!("scratch-{}-live", std::process::id()));
    std::fs::create_dir_all(abandoned.join("tree")).unwrap();
    std::fs::create_dir_all(&ours).unwrap();
    let fresh = f.project.scratch().unwrap();
    assert!(!abandoned.exists());
    assert!(ours.exists() && fresh.path().exists());
}

#[test]
fn host_src_may_be_an_archive() {
    let f = Fixture::new();
    let archive = f.tmp.join("host.tar.gz");
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&f.tmp)
        .arg("upstream")
        .status()
        .unwrap();
    assert!(status.success());
    let sh = Shell::new().unwrap();
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), Some(&archive)).unwrap();
    assert!(
        stamp.verified && stamp.source.starts_with("archive "),
        "{}",
        stamp.source
    );
    assert_eq!(
        tree_hash(&f.project.pristine_dir(HOST)).unwrap().digest,
        f.hash
    );

    // A truncated archive is reported and changes nothing.
    let bytes = std::fs::read(&archive).unwrap();
    let broken = f.tmp.join("broken.tar.gz");
    std::fs::write(&broken, &bytes[..bytes.len() / 2]).unwrap();
    let err = err_text(host::ensure_pristine(
        &sh,
        &f.project,
        &f.host(),
        Some(&broken),
    ));
    assert!(err.contains("corrupt or truncated"), "{err}");
    assert_eq!(
        tree_hash(&f.project.pristine_dir(HOST)).unwrap().digest,
        f.hash
    );
}
