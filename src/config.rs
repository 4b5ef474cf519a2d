//! The configuration file (`--config FILE`, or `TOOLSPAN_CONFIG`): one TOML file of settings
//! for every command, layered as defaults < file < `TOOLSPAN_*` environment < flags.
//!
//! Its keys are the flags' long names (`flush-ms`, or `flush_ms`): the global flags (`log`,
//! `log-format`, `storage-option`) at the top, and a table per command (`[serve]`, `[ingest]`,
//! ...) holding that command's flags and, to override them for it, the global ones. A flag
//! that takes no value is `true`/`false`; a repeatable one takes an array (`redact = [...]`),
//! and a repeatable `KEY=VALUE` one also a table (`storage-option = { aws_region = "..." }`).
//! Unknown commands and keys are errors, so a misspelt setting is never silently ignored.
//!
//! The file becomes command-line arguments (`--flush-ms=500`) that clap then parses with the
//! user's own, so every value is checked by the same parser, named in the same errors and
//! documented by the same `--help`. A setting is added only when a first parse says its flag
//! came neither from the command line nor from its environment variable.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};
use toolspan_schema::Code;

use crate::fail::Failure;

/// The largest configuration file read: settings fit many times over.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The file's text: a regular file (not a device, a pipe or a directory, which could be read
/// forever or block) of at most [`MAX_FILE_BYTES`].
fn read_bounded(path: &std::path::Path, shown: &str) -> Result<String, Failure> {
    use std::io::Read;
    let cannot =
        |e: std::io::Error| invalid(format!("cannot read config file {shown}: {}", e.kind()), &e);
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if !meta.is_file() {
        return Err(invalid(
            format!("config file {shown} is not a regular file; name a TOML file"),
            &shown,
        ));
    }
    let too_big = || {
        invalid(
            format!("config file {shown} is larger than {MAX_FILE_BYTES} bytes, the most toolspan reads"),
            &shown,
        )
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes)
        .map_err(|e| invalid(format!("config file {shown} is not UTF-8 text"), &e))
}

/// The global flags that the file cannot set.
const NOT_SETTABLE: [&str; 3] = ["config", "help", "version"];

/// `argv` with the settings of the configuration file added, or `argv` as it was when no file
/// is named (or the arguments do not parse: clap then reports them as usual).
pub fn apply(argv: Vec<OsString>, cmd: Command) -> Result<Vec<OsString>, Failure> {
    let mut cmd = cmd;
    cmd.build();
    let Ok(first) = cmd.clone().ignore_errors(true).try_get_matches_from(&argv) else {
        return Ok(argv);
    };
    let sub = first.subcommand();
    let path = config_path(&first).or_else(|| sub.and_then(|(_, m)| config_path(m)));
    let Some(path) = path else {
        return Ok(argv);
    };
    let shown = path.display().to_string();
    let text = read_bounded(&path, &shown)?;
    let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        invalid(
            format!("config file {shown}: {}", e.to_string().trim_end()),
            &e,
        )
    })?;
    let globals: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| settable(a) && a.is_global_set())
        .collect();

    // Every key is checked, not only the running command's: a typo anywhere is an error.
    let mut top: Vec<(&clap::Arg, &toml::Value)> = Vec::new();
    let mut sections: Vec<(&str, &toml::Table)> = Vec::new();
    for (key, value) in &doc {
        if let Some(arg) = find(globals.iter().copied(), key) {
            top.push((arg, value));
        } else if let Some(sc) = cmd.find_subcommand(key) {
            let Some(table) = value.as_table() else {
                return Err(invalid(
                    format!("config file {shown}: [{key}] must be a table of {key}'s settings"),
                    &key,
                ));
            };
            for k in table.keys() {
                if find(sc.get_arguments().filter(|a| settable(a)), k).is_none() {
                    return Err(invalid(
                        format!(
                            "config file {shown}: unknown setting `{k}` in [{key}]; its settings are {}",
                            names(sc.get_arguments())
                        ),
                        &k,
                    ));
                }
            }
            sections.push((sc.get_name(), table));
        } else {
            return Err(invalid(
                format!(
                    "config file {shown}: unknown setting `{key}`; the top level takes {} and a table per command ({})",
                    names(globals.iter().copied()),
                    cmd.get_subcommands()
                        .map(|c| format!("[{}]", c.get_name()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &key,
            ));
        }
    }

    let Some((name, sub_matches)) = sub else {
        return Ok(argv);
    };
    let Some(sc) = cmd.find_subcommand(name) else {
        return Ok(argv);
    };
    // The command's own table wins over the top level for the global flags it sets.
    let mut settings: Vec<(&clap::Arg, &toml::Value)> = top;
    if let Some((_, table)) = sections.iter().find(|(n, _)| *n == name) {
        for (k, v) in table.iter() {
            if let Some(arg) = find(sc.get_arguments().filter(|a| settable(a)), k) {
                settings.retain(|(a, _)| a.get_id() != arg.get_id());
                settings.push((arg, v));
            }
        }
    }
    let mut added: Vec<OsString> = Vec::new();
    for (arg, value) in settings {
        if given(&first, sub_matches, arg) {
            continue;
        }
        added.extend(to_args(arg, value).map_err(|why| {
            invalid(
                format!(
                    "config file {shown}: `{}` {why}",
                    arg.get_long().unwrap_or_default()
                ),
                &why,
            )
        })?);
    }
    // After the user's arguments, before a `--` that ends the options.
    let mut out = argv;
    let at = out.iter().position(|a| a == "--").unwrap_or(out.len());
    out.splice(at..at, added);
    Ok(out)
}

fn invalid(message: String, detail: &dyn std::fmt::Display) -> Failure {
    Failure::new(Code::InvalidArgument, message, detail)
}

fn config_path(m: &ArgMatches) -> Option<PathBuf> {
    m.try_get_one::<PathBuf>("config").ok().flatten().cloned()
}

fn settable(a: &clap::Arg) -> bool {
    a.get_long().is_some() && !NOT_SETTABLE.contains(&a.get_id().as_str())
}

/// The argument whose long name is `key` (`_` and `-` alike).
fn find<'a>(mut args: impl Iterator<Item = &'a clap::Arg>, key: &str) -> Option<&'a clap::Arg> {
    let key = key.replace('_', "-");
    args.find(|a| settable(a) && a.get_long() == Some(key.as_str()))
}

fn names<'a>(args: impl Iterator<Item = &'a clap::Arg>) -> String {
    let v: Vec<&str> = args
        .filter(|a| settable(a))
        .filter_map(|a| a.get_long())
        .collect();
    v.join(", ")
}

/// Whether the user set `arg` on the command line or through its environment variable.
fn given(root: &ArgMatches, sub: &ArgMatches, arg: &clap::Arg) -> bool {
    let id = arg.get_id().as_str();
    [root, sub].iter().any(|m| {
        matches!(
            m.try_contains_id(id).ok().and_then(|_| m.value_source(id)),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    })
}

/// The command-line form of one setting.
fn to_args(arg: &clap::Arg, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let long = arg.get_long().unwrap_or_default();
    let one = |v: &str| OsString::from(format!("--{long}={v}"));
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => match value {
            toml::Value::Boolean(b) => {
                let set = matches!(arg.get_action(), ArgAction::SetTrue) == *b;
                Ok(if set {
                    vec![OsString::from(format!("--{long}"))]
                } else {
                    vec![]
                })
            }
            _ => Err("takes true or false".into()),
        },
        ArgAction::Append => {
            let key_value = arg
                .get_value_names()
                .is_some_and(|n| n.iter().any(|n| n.as_str() == "KEY=VALUE"));
            match value {
                toml::Value::Array(items) => {
                    items.iter().map(|v| scalar(v).map(|s| one(&s))).collect()
                }
                toml::Value::Table(t) if key_value => t
                    .iter()
                    .map(|(k, v)| scalar(v).map(|s| one(&format!("{k}={s}"))))
                    .collect(),
                toml::Value::Table(_) => Err("takes a value or an array of values".into()),
                v => Ok(vec![one(&scalar(v)?)]),
            }
        }
        _ => Ok(vec![one(&scalar(value)?)]),
    }
}

fn scalar(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Datetime(d) => Ok(d.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) => {
            Err("takes one value here, not an array or a table".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn run(file: &str, args: &[&str]) -> Result<Vec<String>, String> {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("toolspan.toml");
        std::fs::write(&path, file).expect("write");
        let mut argv: Vec<OsString> = vec!["toolspan".into(), "--config".into(), path.into()];
        argv.extend(args.iter().map(OsString::from));
        apply(argv, crate::Cli::command())
            .map(|v| {
                v.into_iter()
                    .skip(3)
                    .map(|s| s.to_string_lossy().into_owned())
                    .collect()
            })
            .map_err(|f| f.message)
    }

    #[test]
    fn settings_become_flags_after_the_users_own() {
        let file = r#"
            log = "debug"
            storage-option = { aws_region = "eu-west-1" }
            [serve]
            flush_ms = 250
            redact = ["acct-[0-9]+", "-x"]
            [ingest]
            kafka-option = ["fetch.wait.max.ms=5"]
        "#;
        let got = run(file, &["serve", "--data-dir", "d"]).expect("applies");
        assert_eq!(
            got,
            [
                "serve",
                "--data-dir",
                "d",
                "--log=debug",
                "--storage-option=aws_region=eu-west-1",
                "--flush-ms=250",
                "--redact=acct-[0-9]+",
                "--redact=-x"
            ]
        );
        // The command line wins, and `--` still ends the options.
        let got = run(file, &["sql", "--log", "warn", "--", "SELECT 1"]).expect("applies");
        assert_eq!(
            got,
            [
                "sql",
                "--log",
                "warn",
                "--storage-option=aws_region=eu-west-1",
                "--",
                "SELECT 1"
            ]
        );
    }

    #[test]
    fn evals_export_takes_its_flags_from_the_evals_table() {
        let file = "[evals]\ntool = \"search_docs\"\nerror-type = \"PARSE\"\nper_fingerprint = 2\n";
        assert_eq!(
            run(file, &["evals", "export", "--tool", "fetch_url"]).expect("applies"),
            [
                "evals",
                "export",
                "--tool",
                "fetch_url",
                "--error-type=PARSE",
                "--per-fingerprint=2"
            ]
        );
        let unknown =
            run("[evals]\nper-fingerprints = 2\n", &["evals", "export"]).expect_err("typo");
        assert!(unknown.contains("per-fingerprint"), "{unknown}");
    }

    #[test]
    fn a_commands_table_overrides_the_top_level_and_booleans_are_flags() {
        let file = "log = \"info\"\n[demo]\nlog = \"warn\"\nkeep-serving = true\n";
        assert_eq!(
            run(file, &["demo"]).expect("applies"),
            ["demo", "--keep-serving", "--log=warn"]
        );
    }

    #[test]
    fn the_example_file_is_valid_for_every_command() {
        let file = include_str!("../deploy/toolspan.example.toml");
        for args in [
            &["serve"][..],
            &["demo"],
            &["ingest"],
            &["metrics"],
            &["query"],
            &["sql", "SELECT 1"],
            &["compare", "--tool", "t", "--before", "1", "--after", "2"],
        ] {
            let got = run(file, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(got.contains(&"--log-format=json".to_string()), "{got:?}");
        }
        let ingest = run(file, &["ingest"]).expect("ingest");
        assert!(ingest.contains(&"--kafka-option=security.protocol=SASL_SSL".to_string()));
        assert!(ingest.contains(&"--table=s3://toolspan/spans".to_string()));
    }

    #[test]
    fn mistakes_are_named() {
        let unknown = run("[serve]\nflush-msx = 1\n", &["sql", "SELECT 1"]).expect_err("typo");
        assert!(
            unknown.contains("unknown setting `flush-msx` in [serve]"),
            "{unknown}"
        );
        assert!(
            unknown.contains("flush-ms"),
            "lists the settings: {unknown}"
        );
        let top = run("servee = {}\n", &["sql", "SELECT 1"]).expect_err("typo");
        assert!(
            top.contains("unknown setting `servee`") && top.contains("[serve]"),
            "{top}"
        );
        let shape = run("[serve]\nflush-ms = [1, 2]\n", &["serve"]).expect_err("array");
        assert!(shape.contains("`flush-ms` takes one value"), "{shape}");
        let syntax = run("[serve\n", &["serve"]).expect_err("syntax");
        assert!(syntax.contains("line 1"), "{syntax}");
        let missing = apply(
            [
                "toolspan",
                "--config",
                "/nonexistent/toolspan.toml",
                "sql",
                "SELECT 1",
            ]
            .map(OsString::from)
            .to_vec(),
            crate::Cli::command(),
        );
        assert!(missing.is_err_and(|f| f.message.contains("cannot read config file")));
    }
}
