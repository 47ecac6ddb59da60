//! The docs cannot rot: every ```console block of `docs/*.md` runs here, in order, against the
//! local world, and the output each block shows must appear in what the commands print.
//!
//! The format of a runnable block:
//! - `$ command` starts a command, `> line` continues it (a heredoc, a `\` continuation);
//! - any other line is output the command must print (compared with runs of spaces collapsed;
//!   a duration token such as `4s` or `1m30s` matches any duration, ages differ per run);
//! - commands of one page run in one bash session (a function or `export` carries over); a
//!   non-zero exit fails the test with the command's output.
//!
//! The pages use `$NS`, `$FLOW`, `$TOPIC` and `$GROUP` (the runbook sets them to `demo`,
//! `drill`, `drill-orders`, `drill-app` for a reader); this test sets its own: a throwaway
//! namespace with its own operator (chart installed like the other operator tests), unique topic
//! and group names, and maps the reader's names (`drill-orders`, `drill-app`, `demo`) in the
//! shown output to them. It never stops a
//! broker, and removes its namespace, topics and groups even when it fails.
//!
//! Needs `target/debug/mirrorflow` built (`cargo build -p mirrorflow`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mirrorflow_e2e::operator::install_operator;
use mirrorflow_e2e::{World, kafka, run, unique};
use rdkafka::admin::AdminOptions;

/// Everything, operator install included, must finish within this (the drill takes about 2
/// minutes); each page gets what is left.
const BUDGET: Duration = Duration::from_secs(230);

/// One `$ ` command and the output lines shown under it.
#[derive(Debug, PartialEq)]
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The runnable steps of a Markdown page: the ```console blocks.
fn steps(markdown: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut in_block = false;
    for line in markdown.lines() {
        if !in_block {
            in_block = line.trim_end() == "```console";
            continue;
        }
        if line.trim_end() == "```" {
            in_block = false;
        } else if let Some(cmd) = line.strip_prefix("$ ") {
            out.push(Step {
                command: cmd.to_string(),
                expected: Vec::new(),
            });
        } else if let (Some(cont), Some(step)) = (line.strip_prefix("> "), out.last_mut()) {
            step.command.push('\n');
            step.command.push_str(cont);
        } else if let Some(step) = out.last_mut()
            && !line.trim().is_empty()
        {
            step.expected.push(line.to_string());
        }
    }
    out
}

fn is_duration(token: &str) -> bool {
    let mut rest = token;
    let mut any = false;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        let Some(unit) = unit else { return false };
        rest = &rest[unit.len()..];
        any = true;
    }
    any
}

/// Whether the shown line appears in `actual`: same tokens in order, separated by any
/// whitespace on one line, durations matching any duration.
fn shows(actual: &str, expected: &str) -> bool {
    let want: Vec<&str> = expected.split_whitespace().collect();
    actual.lines().any(|line| {
        let got: Vec<&str> = line.split_whitespace().collect();
        got.windows(want.len()).any(|w| {
            w.iter()
                .zip(&want)
                .all(|(g, e)| g == e || (is_duration(e) && is_duration(g)))
        })
    })
}

/// The reader's names in the shown output, replaced by this run's in one pass.
fn substitute(line: &str, names: &[(&str, &str)]) -> String {
    line.split_whitespace()
        .map(|token| {
            names
                .iter()
                .find_map(|(from, to)| {
                    token
                        .find(from)
                        .map(|i| format!("{}{to}{}", &token[..i], &token[i + from.len()..]))
                })
                .unwrap_or_else(|| token.to_string())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The bash script of a page: each step's output and exit status in `dir`, stopping at the
/// first failure.
fn script(steps: &[Step], dir: &Path) -> String {
    let mut s = String::new();
    for (i, step) in steps.iter().enumerate() {
        let out = dir.join(format!("{i}.out"));
        let rc = dir.join(format!("{i}.rc"));
        s.push_str(&format!(
            "{{\n{}\n}} >'{}' 2>&1 </dev/null\necho $? >'{}'\n[ \"$(cat '{}')\" = 0 ] || exit 0\n",
            step.command,
            out.display(),
            rc.display(),
            rc.display()
        ));
    }
    s
}

struct Env {
    ns: String,
    topic: String,
    group: String,
}

/// Runs a page and checks each step; the error names the page, the step and its output.
fn run_page(world: &World, page: &Path, env: &Env, deadline: Instant) -> Result<usize> {
    let text = std::fs::read_to_string(page)?;
    let steps = steps(&text);
    if steps.is_empty() {
        return Ok(0);
    }
    let dir = std::env::temp_dir().join(unique("mirrorflow-docs"));
    std::fs::create_dir_all(&dir)?;
    let script_path = dir.join("page.sh");
    std::fs::write(&script_path, script(&steps, &dir))?;
    let started = Instant::now();
    let left = deadline.saturating_duration_since(started).as_secs().max(1);
    let status = Command::new("timeout")
        .arg(left.to_string())
        .arg("bash")
        .arg(&script_path)
        .current_dir(&world.repo_root)
        .env("NS", &env.ns)
        .env("FLOW", "drill")
        .env("TOPIC", &env.topic)
        .env("GROUP", &env.group)
        .status()
        .context("running bash")?;
    let names = [
        ("drill-orders", env.topic.as_str()),
        ("drill-app", env.group.as_str()),
        ("demo", env.ns.as_str()),
    ];
    let result = (|| {
        for (i, step) in steps.iter().enumerate() {
            let out = std::fs::read_to_string(dir.join(format!("{i}.out"))).unwrap_or_default();
            let rc = std::fs::read_to_string(dir.join(format!("{i}.rc"))).unwrap_or_default();
            if rc.trim() != "0" {
                bail!(
                    "{}: step {i} `{}` {} after {:?} (bash: {status}):\n{out}",
                    page.display(),
                    step.command,
                    if rc.is_empty() {
                        "did not finish".to_string()
                    } else {
                        format!("exited {}", rc.trim())
                    },
                    started.elapsed()
                );
            }
            for line in &step.expected {
                let want = substitute(line, &names);
                if !shows(&out, &want) {
                    bail!(
                        "{}: step {i} `{}` does not print `{want}`; it printed:\n{out}",
                        page.display(),
                        step.command
                    );
                }
            }
        }
        Ok(steps.len())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Removes what the pages create, even when a step failed half-way.
struct Cleanup<'a> {
    world: &'a World,
    env: &'a Env,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let ns = &self.env.ns;
        let _ = run(
            "kubectl",
            &["delete", "mf", "--all", "-n", ns, "--wait=true"],
        );
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", ns]);
        let _ = run("kubectl", &["delete", "namespace", ns, "--wait=false"]);
        let Ok(rt) = tokio::runtime::Runtime::new() else {
            return;
        };
        let remote = format!("dr-east.{}", self.env.topic);
        for (bootstrap, topic) in [
            (&self.world.source_bootstrap, self.env.topic.as_str()),
            (&self.world.target_bootstrap, remote.as_str()),
        ] {
            let Ok(admin) = kafka::admin(bootstrap) else {
                continue;
            };
            let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
            let _ = rt.block_on(admin.delete_topics(&[topic], &opts));
            let _ = rt.block_on(admin.delete_groups(&[self.env.group.as_str()], &opts));
        }
    }
}

#[test]
fn every_console_block_of_the_docs_runs() -> Result<()> {
    let world = World::from_env()?;
    let docs = world.repo_root.join("docs");
    let mut pages: Vec<_> = std::fs::read_dir(&docs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    let id = unique("run");
    let env = Env {
        ns: unique("docs"),
        topic: format!("drill-orders-{id}"),
        group: format!("drill-app-{id}"),
    };
    let _cleanup = Cleanup {
        world: &world,
        env: &env,
    };
    let start = Instant::now();
    let deadline = start + BUDGET;
    install_operator(&world, &env.ns)?;
    let mut total = 0;
    for page in &pages {
        let n = run_page(&world, page, &env, deadline)?;
        eprintln!(
            "{}: {n} commands ran ({:?} since the start)",
            page.display(),
            start.elapsed()
        );
        total += n;
    }
    if total == 0 {
        bail!("no ```console command found under {}", docs.display());
    }
    Ok(())
}

#[test]
fn runnable_blocks_parse() {
    let md = "text\n```console\n$ echo a \\\n>   b\na b\n$ true\n```\n```sh\nnot run\n```\n";
    let s = steps(md);
    assert_eq!(
        s,
        vec![
            Step {
                command: "echo a \\\n  b".into(),
                expected: vec!["a b".into()],
            },
            Step {
                command: "true".into(),
                expected: vec![],
            },
        ]
    );
    assert!(shows("x   drill   True  12s  y\n", "drill True 0s"));
    assert!(!shows("drill False 0s\n", "drill True 0s"));
    assert!(is_duration("1m30s") && is_duration("250ms") && !is_duration("2") && !is_duration("s"));
    assert_eq!(
        substitute(
            "drill-app east.drill-orders 0",
            &[
                ("drill-orders", "drill-orders-x"),
                ("drill-app", "drill-app-x")
            ]
        ),
        "drill-app-x east.drill-orders-x 0"
    );
}
