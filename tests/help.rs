//! What `--help` and the docs say agree with each other and with the code: the views `sql`
//! names, the trace memory's cost per span, the README's command table, and no reference to
//! a design document the repository does not hold.

use std::process::Command;

use crate::support::{bin, repo_root};

fn help(args: &[&str]) -> String {
    let out = Command::new(bin())
        .args(args)
        .arg("--help")
        .output()
        .expect("run toolspan --help");
    assert!(out.status.success(), "{args:?} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The flags a command's help lists (each with its short form, if any), without the global
/// ones every command has.
fn flags(help: &str) -> Vec<Vec<String>> {
    let global = [
        "--log",
        "--log-format",
        "--storage-option",
        "--config",
        "--help",
        "--version",
    ];
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            l.split(", ")
                .map(|n| {
                    n.split(|c: char| c.is_whitespace() || c == '=' || c == '<')
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .filter(|n| n.starts_with('-'))
                .collect::<Vec<_>>()
        })
        .filter(|names| !names.iter().any(|n| global.contains(&n.as_str())))
        .collect()
}

#[test]
fn help_and_docs_agree() {
    let sql = help(&["sql"]);
    for view in ["calls", "recoveries", "failure_rates"] {
        assert!(
            sql.contains(view),
            "sql --help names the {view} view:\n{sql}"
        );
    }

    // One figure for what a remembered span costs, in the help and in docs/ingest.md.
    let serve = help(&["serve"]);
    let ingest_md = read("docs/ingest.md");
    assert!(serve.contains("about 50 bytes"), "{serve}");
    assert!(ingest_md.contains("about 50 bytes a span"));
    assert!(!serve.contains("150 bytes") && !ingest_md.contains("150 bytes"));

    // The README's command table names every flag of serve, demo and metrics.
    let readme = read("README.md");
    for command in ["serve", "demo", "metrics"] {
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `toolspan {command} ")))
            .unwrap_or_else(|| panic!("the README's table has {command}"));
        let text = if command == "demo" {
            // demo takes serve's flags too, and its row says so.
            assert!(row.contains("`serve`'s flags"), "{row}");
            help(&["demo"])
                .lines()
                .filter(|l| !serve.contains(l.trim()))
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            help(&[command])
        };
        for names in flags(&text) {
            assert!(
                names
                    .iter()
                    .any(|n| row.contains(&format!("{n} ")) || row.contains(&format!("{n}]"))),
                "the README's {command} row omits {names:?}: {row}"
            );
        }
    }

    // The design document is not in the repository: the docs state its rules instead.
    let out = Command::new("git")
        .args([
            "grep",
            "-n",
            "DESIGN §",
            "--",
            "README.md",
            "docs",
            "dashboards",
            "sdk",
        ])
        .args([
            "src", "schema", "pipeline", "metrics", "query", "serve", "ingest", "store",
        ])
        .current_dir(repo_root())
        .output()
        .expect("run git grep");
    assert!(
        out.stdout.is_empty(),
        "references to a design document the repository lacks:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
