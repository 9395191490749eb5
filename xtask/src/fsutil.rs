//! File-tree helpers: copies that keep symlinks and modes, and directory swaps that never leave a
//! half-written destination.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};

/// Copies `src` to `dest` (which must not exist), keeping symlinks as links and file modes.
/// `skip` gets paths relative to `src`.
pub fn copy_tree(src: &Path, dest: &Path, skip: &dyn Fn(&Path) -> bool) -> Result<()> {
    copy_dir(src, dest, Path::new(""), skip)
}

fn copy_dir(
    src_root: &Path,
    dest_root: &Path,
    rel: &Path,
    skip: &dyn Fn(&Path) -> bool,
) -> Result<()> {
    let dest = dest_root.join(rel);
    std::fs::create_dir_all(&dest).with_context(|| format!("creating {}", dest.display()))?;
    let src = src_root.join(rel);
    for entry in std::fs::read_dir(&src).with_context(|| format!("listing {}", src.display()))? {
        let entry = entry?;
        let rel_child = rel.join(entry.file_name());
        if skip(&rel_child) {
            continue;
        }
        let from = entry.path();
        let to = dest_root.join(&rel_child);
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            copy_dir(src_root, dest_root, &rel_child, skip)?;
        } else if file_type.is_symlink() {
            let target = std::fs::read_link(&from)?;
            std::os::unix::fs::symlink(&target, &to)
                .with_context(|| format!("linking {}", to.display()))?;
        } else {
            std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    Ok(())
}

pub fn set_executable(path: &Path) -> Result<()> {
    let mut perms = std::fs::metadata(path)?.permissions();
    perms.set_mode(perms.mode() | 0o111);
    std::fs::set_permissions(path, perms).with_context(|| format!("chmod +x {}", path.display()))
}

/// Puts `staged` at `dest`, replacing what was there. The old tree is renamed aside before the
/// new one is renamed in, so `dest` is always either the old or the new tree, never a mix.
pub fn replace_dir(staged: &Path, dest: &Path) -> Result<()> {
    let parent = dest.parent().context("destination has no parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let old = dest.with_extension("old");
    if old.exists() {
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    if dest.exists() {
        std::fs::rename(dest, &old).with_context(|| format!("moving {} aside", dest.display()))?;
    }
    std::fs::rename(staged, dest)
        .with_context(|| format!("moving {} into place", dest.display()))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_keeps_links_and_modes_and_skips() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("d/.git")).unwrap();
        std::fs::write(src.path().join("d/.git/HEAD"), "x").unwrap();
        std::fs::write(src.path().join("d/run.sh"), "#!/bin/sh\n").unwrap();
        set_executable(&src.path().join("d/run.sh")).unwrap();
        std::os::unix::fs::symlink("run.sh", src.path().join("d/link")).unwrap();

        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("copy");
        copy_tree(src.path(), &dest, &|rel| {
            rel.file_name().is_some_and(|n| n == ".git")
        })
        .unwrap();
        assert!(!dest.join("d/.git").exists());
        let mode = std::fs::metadata(dest.join("d/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        assert_eq!(
            std::fs::read_link(dest.join("d/link")).unwrap(),
            Path::new("run.sh")
        );
    }

    #[test]
    fn replace_dir_swaps_whole_trees() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("tree");
        std::fs::create_dir_all(dest.join("old-only")).unwrap();
        let staged = root.path().join("staged");
        std::fs::create_dir_all(staged.join("new-only")).unwrap();
        replace_dir(&staged, &dest).unwrap();
        assert!(dest.join("new-only").is_dir());
        assert!(!dest.join("old-only").exists());
        assert!(!staged.exists());
        assert!(!root.path().join("tree.old").exists());
    }
}
