//! The `sluice` command line end to end: `apply` persists, `check --data-dir` reads without
//! changing anything, the config layer is read-only, exit codes and errors say what happened.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn sluice(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait")
}

/// `sluice ARGS` run from the repository's root, so that paths in its output are relative.
fn sluice_in_root(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn listing(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir.join("workloads"))
        .expect("workloads dir")
        .map(|e| {
            let p = e.expect("entry").path();
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read_to_string(&p).unwrap_or_default())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn apply_persists_and_check_reads_a_data_dir_without_changing_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8 path");
    let out = sluice(
        &["apply", "--data-dir", data_arg, "-"],
        Some("CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2; CREATE WORKLOAD `a b` IN all;"),
    );
    assert!(out.status.success(), "{}", stdout(&out));
    assert_eq!(
        listing(&data)
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["resource_q.sql", "workload_a%20b.sql", "workload_all.sql"]
    );
    let before = listing(&data);

    let out = sluice(
        &["check", "--dump", "--data-dir", data_arg, "-"],
        Some("CREATE WORKLOAD c IN all; DROP WORKLOAD all; CREATE WORKLOAD `a b` IN all"),
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(">> CREATE WORKLOAD c IN all\nOK\n"), "{text}");
    assert!(text.contains("ERROR BAD_ARGUMENTS: Workload entity 'all' cannot be dropped. It is referenced by: a b c. (BAD_ARGUMENTS)"), "{text}");
    assert!(
        text.contains("ERROR BAD_ARGUMENTS: Workload entity 'a b' already exists. (BAD_ARGUMENTS)"),
        "{text}"
    );
    assert!(
        text.contains(
            "q\t/all/semaphore\tinflight_limit\t1\t0\t0\t2\t9223372036854775807\t\\N\t\\N\n"
        ),
        "{text}"
    );
    assert_eq!(listing(&data), before, "check must not change the data dir");

    // Applying stops at the first error and keeps what came before it.
    let out = sluice(
        &["apply", "--data-dir", data_arg, "-"],
        Some("CREATE WORKLOAD d IN all; CREATE WORKLOAD e IN nowhere; CREATE WORKLOAD f IN all"),
    );
    assert_eq!(out.status.code(), Some(1));
    let names: Vec<String> = listing(&data).into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"workload_d.sql".to_string())
            && !names.iter().any(|n| n.contains("_e.") || n.contains("_f.")),
        "{names:?}"
    );
}

#[test]
fn a_corrupt_catalog_file_stops_with_its_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("workloads")).expect("mkdir");
    std::fs::write(
        dir.path().join("workloads/workload_x.sql"),
        "CREATE WORKLOAD x SETTINGS weight = ",
    )
    .expect("write");
    let out = sluice(
        &[
            "check",
            "--data-dir",
            dir.path().to_str().expect("utf-8"),
            "-",
        ],
        Some(""),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("workload_x.sql") && err.contains("SYNTAX_ERROR"),
        "{err}"
    );
}

#[test]
fn config_layer_and_machine_pinning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        "[server]\ncores = 8\n\n[catalog]\nstatements = \"\"\"\nRESOURCE cpu (MASTER THREAD, WORKER THREAD);\nWORKLOAD all SETTINGS max_concurrent_threads_ratio_to_cores = 0.5;\n\"\"\"\n",
    )
    .expect("write config");
    let cfg = config.to_str().expect("utf-8");
    let out = sluice(&["check", "--dump", "--config", cfg, "-"], Some("CREATE WORKLOAD dev IN all; DROP WORKLOAD all; CREATE OR REPLACE RESOURCE cpu (MASTER THREAD)"));
    let text = stdout(&out);
    assert!(
        text.contains("ERROR BAD_ARGUMENTS: It is not allowed to remove workload entity 'all' that is stored in read-only configuration storage"),
        "{text}"
    );
    assert!(text.contains("ERROR BAD_ARGUMENTS: It is not allowed to replace workload entity 'cpu' that is stored in read-only configuration storage"), "{text}");
    // 0.5 × 8 cores from the config; --cores overrides it.
    assert!(
        text.contains("cpu\t/all/semaphore\tinflight_limit\t1\t0\t0\t4\t"),
        "{text}"
    );
    let out = sluice(
        &["check", "--dump", "--config", cfg, "--cores", "2", "-"],
        Some(""),
    );
    assert!(
        stdout(&out).contains("cpu\t/all/semaphore\tinflight_limit\t1\t0\t0\t1\t"),
        "{}",
        stdout(&out)
    );

    std::fs::write(&config, "[server]\ncores = 8\nlisten_adress = \"x\"\n").expect("write config");
    let out = sluice(&["check", "--config", cfg, "-"], Some(""));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listen_adress"), "a bad key is named: {err}");
}

#[test]
fn check_exit_codes() {
    assert_eq!(
        sluice(&["check", "-"], Some("CREATE WORKLOAD all"))
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        sluice(&["check", "-"], Some("CREATE WORKLOAD all IN x"))
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        sluice(&["check", "/nonexistent/script.sql"], None)
            .status
            .code(),
        Some(2)
    );
    // sluice's extensions (lane settings, outranked_share, classifiers) pass, unless strict:
    // then they fail as in ClickHouse.
    let lanes = "CREATE WORKLOAD all; CREATE WORKLOAD slow IN all; \
                 CREATE WORKLOAD fast IN all SETTINGS demote_after = '20s', demote_to = 'slow'; \
                 CREATE WORKLOAD adhoc IN all SETTINGS priority = 1, outranked_share = 0.1; \
                 CREATE CLASSIFIER analysts WORKLOAD adhoc WHEN tag('team') = 'analysts'";
    assert_eq!(sluice(&["check", "-"], Some(lanes)).status.code(), Some(0));
    let strict = sluice(&["check", "--strict", "-"], Some(lanes));
    assert_eq!(strict.status.code(), Some(1));
    for refused in [
        "ERROR BAD_ARGUMENTS: Unknown workload setting 'demote_after'",
        "ERROR BAD_ARGUMENTS: Unknown workload setting 'outranked_share'",
        "ERROR SYNTAX_ERROR: Syntax error: CREATE CLASSIFIER is sluice's own",
    ] {
        assert!(stdout(&strict).contains(refused), "{}", stdout(&strict));
    }
}

#[test]
fn sluice_local_runs_scripts_in_process_and_examples_run_clean() {
    let out = sluice(
        &["local", "-"],
        Some(
            "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2;
             CREATE WORKLOAD fast IN all;
             SELECT name, parent FROM system.workloads ORDER BY name;
             SELECT 1 AS one, NULL AS n SETTINGS workload = 'fast';
             SELECT 1 SETTINGS workload = 'all';",
        ),
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "one statement fails: {text}");
    assert!(
        text.contains(">> CREATE WORKLOAD fast IN all\nOK\n"),
        "{text}"
    );
    assert!(text.contains("name\tparent\nall\t\nfast\tall\n"), "{text}");
    assert!(text.contains("one\tn\n1\t\\N\n"), "{text}");
    assert!(
        text.contains(
            "ERROR INVALID_SCHEDULER_NODE: Unable to link to workload 'all' that has children"
        ),
        "{text}"
    );

    // The scenario scripts and the grammar's examples (ClickHouse's documented hierarchies).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ran = 0;
    let entries = ["examples", "grammar/examples"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(root.join(dir)).expect("example directory"));
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "sql") {
            continue;
        }
        let out = sluice(&["local", path.to_str().expect("utf-8 path")], None);
        assert!(out.status.success(), "{}: {}", path.display(), stdout(&out));
        assert!(
            !stdout(&out).contains("\nERROR "),
            "{}: {}",
            path.display(),
            stdout(&out)
        );
        ran += 1;
    }
    assert!(ran >= 3, "only {ran} examples");
}

/// The seed's three lane configurations (and a four-slot FIFO), each replayed by `sluice
/// simulate` on the same small trace; the output must be what `examples/reports/*.expected`
/// holds (`REWRITE=1` rewrites them). What each shows is in `examples/reports/README.md`.
#[test]
fn simulate_replays_the_reports_examples_as_expected() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rewrite = std::env::var_os("REWRITE").is_some();
    let mut names: Vec<String> = std::fs::read_dir(root.join("examples/reports"))
        .expect("examples/reports")
        .filter_map(|e| {
            let name = e.expect("entry").file_name().into_string().expect("utf-8");
            name.strip_suffix(".sql").map(str::to_string)
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "fifo_1",
            "fifo_4",
            "lanes_1_reserved_1",
            "lanes_4_reserved_1"
        ]
    );
    for name in names {
        let sql = format!("examples/reports/{name}.sql");
        let out = sluice_in_root(&[
            "simulate".as_ref(),
            "--each".as_ref(),
            sql.as_ref(),
            "examples/reports/trace.csv".as_ref(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = stdout(&out);
        let expected_path = root.join(format!("examples/reports/{name}.expected"));
        if rewrite {
            std::fs::write(&expected_path, &got).expect("rewrite");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).expect("expected output");
        assert_eq!(
            got, expected,
            "{name}: rerun with REWRITE=1 if the change is meant"
        );
    }

    // In the second burst four learned slow reports arrive before three fast ones: with four
    // FIFO slots the fast ones wait a minute; with one slot kept for them, they do not.
    let fate = |name: &str, n: &str| -> String {
        let text = std::fs::read_to_string(root.join(format!("examples/reports/{name}.expected")))
            .expect("expected output");
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{n} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        fate("fifo_4", "13").contains("57.00s"),
        "{}",
        fate("fifo_4", "13")
    );
    assert!(
        fate("lanes_4_reserved_1", "13").contains("reports       reports            0"),
        "{}",
        fate("lanes_4_reserved_1", "13")
    );

    // A synthetic trace is the same for the same seed.
    let generate = || {
        let args = [
            "simulate",
            "--generate",
            "reports",
            "--queries",
            "5",
            "--seed",
            "3",
        ];
        sluice(&args, None)
    };
    let (a, b) = (generate(), generate());
    assert_eq!(stdout(&a), stdout(&b));
    assert_eq!(stdout(&a).lines().count(), 6);
    assert!(stdout(&a).starts_with("arrival_s,user,application,workload,statement,service_s\n"));

    // A system.query_log export replays too: arrivals from `arrived`, service from `run_ms`,
    // the workload asked for from `initial_workload`; in arrival order whatever the file's.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("query_log.csv");
    std::fs::write(
        &log,
        "query_id,user,workload,initial_workload,fingerprint,arrived,queued_ms,run_ms,outcome,demoted,rows,query\n\
         2,u,reports,reports,x,2026-12-01 10:00:01.000000,0,2000,ok,false,1,\"SELECT 2, 'a'\"\n\
         1,u,reports,reports,x,2026-12-01 10:00:00.000000,0,3000,ok,false,1,SELECT 1\n",
    )
    .expect("write");
    let out = sluice_in_root(&[
        "simulate".as_ref(),
        "--each".as_ref(),
        "examples/reports/fifo_1.sql".as_ref(),
        log.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    let first = text
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap_or_default();
    let second = text
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap_or_default();
    assert!(
        first.contains("SELECT 1") && first.contains("3.00s"),
        "{text}"
    );
    // It arrived a second later and waited two more for the one slot.
    assert!(
        second.contains("2.00s") && second.contains("4.00s"),
        "{text}"
    );

    // A trace that is not one says what it lacks.
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "when,what\n1,2\n").expect("write");
    let out = sluice(
        &[
            "simulate",
            root.join("examples/reports/fifo_1.sql")
                .to_str()
                .expect("utf-8"),
            bad.to_str().expect("utf-8"),
        ],
        None,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no column 'workload'"), "{err}");
}
