//! `pip install ./sdk/python` leaves the checkout as it was: no `build/`, no `*.egg-info`.

use std::process::Command;

use crate::support::{python, repo_root};

/// `git status --porcelain` of the SDK's folder, ignored files included.
fn status() -> String {
    let out = Command::new("git")
        .args(["status", "--porcelain", "--ignored", "--", "sdk/python"])
        .current_dir(repo_root())
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // Bytecode the interpreter writes beside the sources when tests import them.
        .filter(|l| !l.contains("__pycache__"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn pip_install_of_the_sdk_leaves_the_checkout_clean() {
    let before = status();
    let target = tempfile::tempdir().expect("dir");
    // The test venv has the build backend (sdk/python/requirements-test.txt): no download.
    let out = Command::new(python())
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(["--no-deps", "--no-build-isolation", "--target"])
        .arg(target.path())
        .arg(repo_root().join("sdk/python"))
        .output()
        .expect("run pip");
    assert!(
        out.status.success(),
        "pip install ./sdk/python failed (scripts/setup installs its build backend):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for file in ["__init__.py", "py.typed", "_core.py", "adapters"] {
        assert!(
            target.path().join("toolspan").join(file).exists(),
            "the package holds {file}"
        );
    }
    let after = status();
    assert_eq!(after, before, "pip install wrote into sdk/python");
    for junk in ["sdk/python/build", "sdk/python/src/toolspan.egg-info"] {
        assert!(!repo_root().join(junk).exists(), "{junk} was written");
    }
}
