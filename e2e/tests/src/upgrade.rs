//! The pieces of the upgrade tests (`upgrade_traffic`, `upgrade_killed`): the previous
//! release to start from (or the world's own, as a smoke), one flow per delivery mode with live
//! producers and a committing group, polling their status, and knowing when every replicator
//! rolled to the upgraded image.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use mirrorflow::api::MirrorFlow;

use crate::operator::{condition, helm_release, ready_at_generation};
use crate::steady::{self, SteadyProducer, TargetReader, committing_consumer};
use crate::{World, eventually, kafka, run, run_with_input, unique};

pub const PARTITIONS: i32 = 4;
/// One record per partition this often: 40 records a second per flow.
pub const PRODUCE_EVERY: Duration = Duration::from_millis(100);
/// At least once, a restarted replica copies again what was written after its last stored
/// positions (stored every second): more than this much of the flow's records is a bug.
pub const DUPLICATES_WITHIN: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Mode {
    /// The default, no mode named: 0.1.0 copies records, this version whole batches, so an
    /// upgrade from 0.1.0 (the nightly set) switches the copy under traffic (from positions a
    /// copy of records stored).
    AtLeastOnce,
    ExactlyOnce,
    Aligned,
    Batches,
}

impl Mode {
    pub const ALL: [Mode; 4] = [
        Mode::AtLeastOnce,
        Mode::ExactlyOnce,
        Mode::Aligned,
        Mode::Batches,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::AtLeastOnce => "alo",
            Mode::ExactlyOnce => "eos",
            Mode::Aligned => "aligned",
            Mode::Batches => "batches",
        }
    }

    /// The spec lines that choose the mode (crates/api: `exactlyOnce`, `offsets`,
    /// `sourceLoop.copy`).
    pub fn spec(self) -> &'static str {
        match self {
            Mode::AtLeastOnce => "",
            Mode::ExactlyOnce => {
                "  exactlyOnce: true\n  sourceLoop: {offsetSyncsLocation: Target}\n"
            }
            Mode::Aligned => "  offsets: Aligned\n",
            Mode::Batches => "  sourceLoop: {copy: Batches}\n",
        }
    }

    /// Exactly once and aligned offsets are read as consumers of them read: committed only.
    pub fn read_committed(self) -> bool {
        matches!(self, Mode::ExactlyOnce | Mode::Aligned)
    }

    pub fn duplicates_bound(self) -> u64 {
        if self.read_committed() {
            0
        } else {
            DUPLICATES_WITHIN.as_millis() as u64 / PRODUCE_EVERY.as_millis() as u64
                * PARTITIONS as u64
        }
    }
}

/// One poll of a flow's status.
pub struct Sample {
    pub failover_ready: bool,
    /// `status.observedTime`, in milliseconds since the epoch.
    pub observed_ms: Option<i64>,
}

pub struct Flow {
    pub mode: Mode,
    pub topic: String,
    pub alias: String,
    pub remote: String,
    pub group: String,
    pub producer: Option<SteadyProducer>,
    pub reader: Option<TargetReader>,
    pub consumer_stop: Arc<AtomicBool>,
    pub consumer: Option<std::sync::mpsc::Receiver<Result<u64>>>,
    pub samples: Vec<Sample>,
    pub written: Vec<u64>,
}

impl Flow {
    pub fn new(mode: Mode) -> Flow {
        let topic = unique(&format!("upg-{}", mode.name()));
        let alias = format!("ut{}-{}", std::process::id(), mode.name());
        Flow {
            mode,
            remote: format!("{alias}.{topic}"),
            group: format!("{topic}-g"),
            topic,
            alias,
            producer: None,
            reader: None,
            consumer_stop: Arc::new(AtomicBool::new(false)),
            consumer: None,
            samples: Vec::new(),
            written: Vec::new(),
        }
    }

    pub fn yaml(&self, ns: &str, world: &World) -> String {
        format!(
            r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{src}"}}
  target: {{alias: {alias}-t, bootstrapServers: "{tgt}"}}
  topics: ["{topic}"]
  groups: ["{group}"]
  checkpoints: {{interval: 1s}}
{mode}"#,
            name = self.mode.name(),
            alias = self.alias,
            src = world.source_bootstrap,
            tgt = world.target_bootstrap,
            topic = self.topic,
            group = self.group,
            mode = self.mode.spec(),
        )
    }

    pub fn seen(&self) -> HashMap<(i32, u64), steady::Seen> {
        self.reader
            .as_ref()
            .map(TargetReader::seen)
            .unwrap_or_default()
    }
}

/// Where the upgrade starts: the previous release, or (smoke) the world's own.
pub struct From {
    pub chart: String,
    pub version: String,
    pub image_repository: String,
    pub previous: bool,
}

impl From {
    /// How a test's first line names where the upgrade starts.
    pub fn describe(&self) -> String {
        if self.previous {
            format!("release {}", self.version)
        } else {
            format!("smoke, from the world's own release {}", self.version)
        }
    }
}

pub fn previous_release(world: &World) -> Result<(String, String)> {
    let env = std::fs::read_to_string(world.repo_root.join("e2e/previous-release.env"))?;
    let get = |key: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_owned)
            .with_context(|| format!("{key} in e2e/previous-release.env"))
    };
    Ok((get("PREVIOUS_VERSION")?, get("PREVIOUS_COMMIT")?))
}

/// The previous release when the registry has it; else the world's own release (a smoke),
/// unless `MF_UPGRADE_FROM_PREVIOUS=1`.
pub fn upgrade_from(world: &World, registry: &str) -> Result<From> {
    let (version, commit) = previous_release(world)?;
    let chart = format!("oci://{registry}/previous/charts/mirrorflow");
    let shown = run(
        "helm",
        &[
            "show",
            "chart",
            &chart,
            "--version",
            &version,
            "--plain-http",
        ],
    );
    if shown.is_ok() {
        // Installed with --skip-crds: the cluster's CRD must serve both releases as they are.
        let old = run(
            "git",
            &[
                "-C",
                world.repo_root.to_str().context("repo path")?,
                "show",
                &format!("{commit}:crds/mirrorflows.mirrorflow.io.yaml"),
            ],
        )?;
        let now =
            std::fs::read_to_string(world.repo_root.join("crds/mirrorflows.mirrorflow.io.yaml"))?;
        // Field descriptions do not change what the apiserver serves or accepts; the changes
        // this version makes on purpose are served by both operators (`without_intended_changes`).
        ensure!(
            without_intended_changes(served(&old)?)? == without_intended_changes(served(&now)?)?,
            "the CRD changed since release {version}: this test must then apply the old CRD \
             first, upgrade it with the chart, and run alone (world-tests.sh EXCLUSIVE)"
        );
        return Ok(From {
            chart,
            version,
            image_repository: format!("{registry}/previous/mirrorflow"),
            previous: true,
        });
    }
    ensure!(
        std::env::var("MF_UPGRADE_FROM_PREVIOUS").as_deref() != Ok("1"),
        "release {version} is not in the world's registry (run e2e/world.sh previous): {:#}",
        shown.err().map(|e| e.to_string()).unwrap_or_default()
    );
    let own = world.release_version()?;
    Ok(From {
        chart: format!("oci://{registry}/charts/mirrorflow"),
        version: own.trim().to_owned(),
        // The world's image by its `dev` tag: another reference than the digest the checkout's
        // values pin, so the upgrade still rolls every replicator.
        image_repository: format!("{registry}/mirrorflow"),
        previous: false,
    })
}

pub fn install(world: &World, ns: &str, from: &From) -> Result<()> {
    let repository = format!("image.repository={}", from.image_repository);
    let tag = format!(
        "image.tag={}",
        if from.previous { &from.version } else { "dev" }
    );
    helm_release(
        world,
        "install",
        &from.chart,
        (ns, ns),
        &[
            "--version",
            &from.version,
            "--plain-http",
            "--skip-crds",
            "--set",
            &repository,
            "--set",
            &tag,
            "--set",
            "image.digest=",
        ],
    )
}

/// Polls every flow's status once.
pub async fn poll(flows: &mut [Flow], api: &Api<MirrorFlow>) -> Result<()> {
    for f in flows.iter_mut() {
        let mf = api.get(f.mode.name()).await?;
        let observed_ms = mf
            .status
            .as_ref()
            .and_then(|s| s.observed_time.as_deref())
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_millisecond());
        f.samples.push(Sample {
            failover_ready: condition(&mf, "FailoverReady").is_some_and(|c| c.0 == "True"),
            observed_ms,
        });
    }
    Ok(())
}

pub async fn poll_for(flows: &mut [Flow], api: &Api<MirrorFlow>, d: Duration) -> Result<()> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        poll(flows, api).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// The image the upgraded operator runs, which its replicators roll to.
pub fn operator_image(ns: &str) -> Result<String> {
    run(
        "kubectl",
        &[
            "get",
            "deployment",
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/component=operator",
            "-o",
            "jsonpath={.items[0].spec.template.spec.containers[0].image}",
        ],
    )
}

/// Every flow's StatefulSet runs `image` in all its replicas, and every flow is Ready.
pub async fn rolled(
    sts: &Api<StatefulSet>,
    api: &Api<MirrorFlow>,
    flows: &[Flow],
    image: &str,
) -> Result<bool> {
    for f in flows {
        let s = sts.get(f.mode.name()).await?;
        let template = s
            .spec
            .as_ref()
            .and_then(|sp| sp.template.spec.as_ref())
            .and_then(|p| p.containers.first())
            .and_then(|c| c.image.clone());
        let generation = s.metadata.generation;
        let st = s.status.unwrap_or_default();
        // The controller's status describes the template in the spec only once it observed it.
        let done = template.as_deref() == Some(image)
            && st.observed_generation == generation
            && st.update_revision.is_some()
            && st.current_revision == st.update_revision
            && st.updated_replicas == Some(st.replicas)
            && st.ready_replicas == Some(st.replicas);
        if !done || !ready_at_generation(&api.get(f.mode.name()).await?) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A CRD as the apiserver serves it: its YAML without the fields' descriptions.
fn served(crd: &str) -> Result<serde_yaml::Value> {
    fn strip(v: &mut serde_yaml::Value) {
        match v {
            serde_yaml::Value::Mapping(m) => {
                // A description is text; a property named `description` is a schema.
                if m.get("description")
                    .is_some_and(serde_yaml::Value::is_string)
                {
                    m.remove("description");
                }
                m.iter_mut().for_each(|(_, v)| strip(v));
            }
            serde_yaml::Value::Sequence(s) => s.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v: serde_yaml::Value = serde_yaml::from_str(crd).context("parsing the CRD")?;
    strip(&mut v);
    Ok(v)
}

/// `crd` without what 0.2.0 changed on purpose (docs/upgrading.md), each served by both
/// operators:
/// - `spec.sourceLoop.copy` lost its default (`Records`, also written into `sourceLoop`'s own
///   default) and may be null: 0.1.0 reads an unset copy as `Records`, 0.2.0 chooses (whole
///   batches where they carry the flow), and a flow stored under 0.1.0's CRD keeps the
///   `Records` written into it. The field's type and values must still be the same.
/// - `spec.replicationPolicy.separator` gained a pattern: a separator no topic name can hold,
///   which 0.1.0's operator already refused as `InvalidSpec`, is refused by the apiserver.
fn without_intended_changes(mut crd: serde_yaml::Value) -> Result<serde_yaml::Value> {
    let spec = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    if let Some(separator) =
        spec["properties"]["replicationPolicy"]["properties"]["separator"].as_mapping_mut()
    {
        separator.remove("pattern");
    }
    let source_loop = &mut spec["properties"]["sourceLoop"];
    if let Some(default) = source_loop
        .get_mut("default")
        .and_then(|d| d.as_mapping_mut())
    {
        default.remove("copy");
    }
    let copy = source_loop["properties"]["copy"]
        .as_mapping_mut()
        .context("spec.sourceLoop.copy in the CRD")?;
    copy.remove("default");
    copy.remove("nullable");
    Ok(crd)
}

#[test]
fn only_the_intended_changes_are_left_out() -> Result<()> {
    let now = served(include_str!("../../../crds/mirrorflows.mirrorflow.io.yaml"))?;
    let mut before = now.clone();
    {
        let spec =
            &mut before["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let source_loop = &mut spec["properties"]["sourceLoop"];
        source_loop["default"]["copy"] = "Records".into();
        let copy = source_loop["properties"]["copy"]
            .as_mapping_mut()
            .context("copy")?;
        copy.insert("default".into(), "Records".into());
        copy.remove("nullable");
    }
    assert_ne!(before, now);
    assert_eq!(
        without_intended_changes(before.clone())?,
        without_intended_changes(now.clone())?
    );
    // Anything else of the field still counts.
    let mut retyped = before;
    retyped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["sourceLoop"]["properties"]["copy"]["enum"] = vec!["Records"].into();
    assert_ne!(
        without_intended_changes(retyped)?,
        without_intended_changes(now)?
    );
    Ok(())
}

#[test]
fn a_crd_that_differs_in_descriptions_only_serves_the_same() -> Result<()> {
    let crd = "spec:\n  versions:\n  - name: v1\n    schema:\n      description: old\n      type: object\n";
    let reworded = crd.replace("old", "new words");
    let retyped = crd.replace("object", "string");
    let field_named_description =
        format!("{crd}      properties:\n        description: {{type: string}}\n");
    assert_eq!(served(crd)?, served(&reworded)?);
    assert_ne!(served(crd)?, served(&retyped)?);
    assert_ne!(served(crd)?, served(&field_named_description)?);
    Ok(())
}

/// The release to upgrade from, installed in a namespace of its own with the checkout's CRD
/// (the same as the previous release's: [`upgrade_from`] checks), and what a test of its
/// upgrade reads.
pub struct Installed {
    pub from: From,
    pub ns: String,
    /// The operator's image before the upgrade.
    pub old_image: String,
    pub client: kube::Client,
    pub flows: Api<MirrorFlow>,
    pub stateful_sets: Api<StatefulSet>,
    /// Removes the release and the namespace at the end of the test.
    pub cleanup: Cleanup,
}

/// Installs the release to upgrade from in a new namespace named after `prefix`.
pub async fn install_previous(world: &World, prefix: &str) -> Result<Installed> {
    let client = world.kube_client().await?;
    let registry = std::env::var("MF_REGISTRY").context("MF_REGISTRY: run through e2e/test.sh")?;
    let from = upgrade_from(world, &registry)?;
    let ns = unique(prefix);
    let cleanup = Cleanup(ns.clone());
    crate::operator::apply_crds(world)?;
    install(world, &ns, &from)?;
    Ok(Installed {
        old_image: operator_image(&ns)?,
        flows: Api::namespaced(client.clone(), &ns),
        stateful_sets: Api::namespaced(client.clone(), &ns),
        client,
        from,
        ns,
        cleanup,
    })
}

/// Removes the test's release and namespace when dropped, also when the test fails.
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0]);
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

/// Topics, producers, committing groups and the flows; returns once every flow copies and is
/// `FailoverReady`.
pub async fn start_flows(
    world: &World,
    ns: &str,
    flows: &mut [Flow],
    api: &Api<MirrorFlow>,
) -> Result<()> {
    for f in flows.iter_mut() {
        kafka::create_topic(&world.source_bootstrap, &f.topic, PARTITIONS).await?;
        f.producer = Some(SteadyProducer::start(
            &world.source_bootstrap,
            &f.topic,
            PARTITIONS,
            PRODUCE_EVERY,
        )?);
        f.consumer = Some(committing_consumer(
            world.source_bootstrap.clone(),
            f.group.clone(),
            f.topic.clone(),
            f.consumer_stop.clone(),
        ));
        run_with_input("kubectl", &["apply", "-f", "-"], &f.yaml(ns, world))?;
    }
    for f in flows.iter_mut() {
        kafka::wait_for_topic(&world.target_bootstrap, &f.remote, Duration::from_secs(240)).await?;
        f.reader = Some(TargetReader::start(
            &world.target_bootstrap,
            &f.remote,
            PARTITIONS,
            f.mode.read_committed(),
        )?);
    }
    let names: Vec<&str> = flows.iter().map(|f| f.mode.name()).collect();
    eventually(
        "every flow FailoverReady",
        Duration::from_secs(240),
        || async {
            let mut not = Vec::new();
            for n in &names {
                let mf = api.get(n).await?;
                if condition(&mf, "FailoverReady").is_none_or(|c| c.0 != "True") {
                    not.push(format!("{n}: {:?}", condition(&mf, "FailoverReady")));
                }
            }
            if not.is_empty() {
                bail!("not yet: {not:?}")
            }
            Ok(Some(()))
        },
    )
    .await
}

/// `helm upgrade`s release `mirrorflow` in `ns` to this checkout's chart on a blocking thread,
/// so the caller can watch meanwhile: how long after `started` helm was done.
pub fn upgrade_to_checkout(
    ns: &str,
    started: Instant,
) -> Result<tokio::task::JoinHandle<Result<Duration>>> {
    let world = World::from_env()?;
    let ns = ns.to_string();
    Ok(tokio::task::spawn_blocking(move || {
        let chart = world.repo_root.join("charts/mirrorflow");
        helm_release(
            &world,
            "upgrade",
            chart.to_str().context("chart path")?,
            (&ns, &ns),
            &[],
        )
        .map(|()| started.elapsed())
    }))
}

/// Waits up to 90 s for every record each flow's producer wrote to be seen on the target;
/// the outcome, for the caller to report with what it found missing.
pub async fn drained(flows: &[Flow]) -> Result<()> {
    eventually(
        "every record written on the target",
        Duration::from_secs(90),
        || async {
            Ok(flows
                .iter()
                .all(|f| steady::all_arrived(&f.seen(), &f.written))
                .then_some(()))
        },
    )
    .await
}
