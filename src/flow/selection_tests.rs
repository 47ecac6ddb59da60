use super::*;

const BASE: &str =
    "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n";

fn spec(extra: &str) -> MirrorFlowSpec {
    serde_yaml::from_str(&format!("{BASE}{extra}")).expect("a test spec")
}

fn refusal(extra: &str) -> String {
    match check(&spec(extra)) {
        Err(e) => e.to_string(),
        Ok(()) => panic!("accepted: {extra}"),
    }
}

#[test]
fn a_name_in_both_lists_is_refused_naming_both() {
    for (extra, named) in [
        ("topics: [orders]\ntopicsExclude: [orders]\n", "'orders'"),
        (
            "topics: ['orders', 'payments']\ntopicsExclude: ['pay.*']\n",
            "'payments'",
        ),
        (
            "topics: ['^orders$']\ntopicsExclude: ['orders']\n",
            "'orders'",
        ),
        (
            "topics: ['app\\.events']\ntopicsExclude: ['app\\..*']\n",
            "'app.events'",
        ),
        // The default exclude list removes it.
        ("topics: ['audit\\.replica']\n", "'.*\\.replica'"),
    ] {
        let err = refusal(extra);
        assert!(
            err.starts_with("spec.topicsExclude:") && err.contains(named),
            "{extra}: {err}"
        );
    }
}

#[test]
fn an_include_pattern_every_name_of_which_is_excluded_is_refused() {
    for extra in [
        "topics: ['(orders|payments)']\ntopicsExclude: [orders, payments]\n",
        "topics: ['orders-[12]']\ntopicsExclude: ['orders-.*']\n",
        "topics: ['orders(-eu)?']\ntopicsExclude: ['orders.*']\n",
        "topics: ['(?i)ab']\ntopicsExclude: ['[aA][bB]']\n",
    ] {
        let err = refusal(extra);
        assert!(
            err.starts_with("spec.topicsExclude:") && err.contains("selects nothing"),
            "{extra}: {err}"
        );
    }
    // One name survives: a valid selection.
    for extra in [
        "topics: ['orders-[12]']\ntopicsExclude: ['orders-1']\n",
        "topics: ['orders(-eu)?']\ntopicsExclude: ['orders-eu']\n",
    ] {
        assert!(check(&spec(extra)).is_ok(), "{extra}");
    }
}

#[test]
fn an_exclude_that_removes_everything_is_refused() {
    for pattern in [
        ".*",
        ".+",
        "(.*)",
        "^.*$",
        "[a-zA-Z0-9._-]+",
        "\\S*",
        "x|.*",
    ] {
        let err = refusal(&format!("topics: [orders]\ntopicsExclude: ['{pattern}']\n"));
        assert!(
            err.starts_with("spec.topicsExclude:") && err.contains("removes every topic name"),
            "{pattern}: {err}"
        );
    }
    let err = refusal("groups: ['app-.*']\ngroupsExclude: ['.*']\n");
    assert!(
        err.starts_with("spec.groupsExclude:") && err.contains("consumer group"),
        "{err}"
    );
    // Narrower excludes are not "everything".
    for pattern in ["[a-z]+", ".*-dev", "..*x", ".{1,10}"] {
        assert!(
            check(&spec(&format!("topicsExclude: ['{pattern}']\n"))).is_ok(),
            "{pattern}"
        );
    }
}

#[test]
fn groups_emptied_by_their_excludes_are_refused_only_when_checkpointed() {
    let emptied = "groups: ['app-1', 'app-2']\ngroupsExclude: ['app-.*']\n";
    let err = refusal(emptied);
    assert!(
        err.starts_with("spec.groupsExclude: 'app-1'") && err.contains("never checkpointed"),
        "{err}"
    );
    let err = refusal("groups: [console-consumer-7]\n");
    assert!(err.contains("'console-consumer-.*'"), "{err}");
    let err = refusal("groups: []\n");
    assert!(err.starts_with("spec.groups: the list is empty"), "{err}");
    assert!(
        check(&spec(&format!(
            "{emptied}checkpoints: {{enabled: false}}\n"
        )))
        .is_ok()
    );
}

#[test]
fn patterns_that_cannot_match_a_topic_name_are_refused() {
    for pattern in [
        "orders topic",
        "ordérs",
        "orders:v1",
        "",
        "x{250}",
        "[#@]+",
        "a(b c|d e)",
    ] {
        let err = refusal(&format!("topics: ['{pattern}']\n"));
        assert!(
            err.starts_with("spec.topics:") && err.contains("can match no Kafka topic name"),
            "{pattern:?}: {err}"
        );
    }
    for pattern in [
        "orders",
        "orders.*",
        "orders*",
        "orders/*",
        "x{247}",
        "a(b c|d)",
        "[#a]+",
        "(?i)Orders",
        "\\w+",
        ".",
    ] {
        assert!(
            check(&spec(&format!("topics: ['{pattern}']\n"))).is_ok(),
            "{pattern:?}"
        );
    }
    // Group names have no grammar.
    assert!(check(&spec("groups: ['team a/consumers']\n")).is_ok());
}

#[test]
fn defaults_and_ordinary_selections_pass() {
    for extra in [
        "",
        "topics: ['orders', 'payments.*']\n",
        "topics: ['.*']\ntopicsExclude: ['.*-dev']\n",
        "groups: ['app-.*']\ngroupsExclude: ['app-test']\n",
        "topics: ['(a|b|c)-[0-9]']\ntopicsExclude: ['a-1']\n",
    ] {
        assert!(check(&spec(extra)).is_ok(), "{extra}");
    }
}

#[test]
fn finite_names_are_expanded_exactly_and_bounded() {
    let names = |p: &str| parse(p).and_then(|h| finite_names(&h));
    assert_eq!(names("orders"), Some(vec!["orders".to_string()]));
    assert_eq!(
        names("(a|b)-[12]"),
        Some(
            vec!["a-1", "a-2", "b-1", "b-2"]
                .into_iter()
                .map(String::from)
                .collect()
        )
    );
    assert_eq!(names("ab?").map(|v| v.len()), Some(2));
    assert_eq!(names("orders.*"), None);
    assert_eq!(names("[a-z]{3}"), None, "26^3 names");
    assert_eq!(names("x+"), None);
}

#[test]
fn patterns_whose_remote_names_are_too_long_for_kafka_are_refused() {
    // Alias `a` and separator `.`: a source name has at most 247 characters.
    for pattern in ["x{248}", "x{249}", "orders-[a-z]{241}"] {
        let err = refusal(&format!("topics: ['{pattern}']\n"));
        assert!(
            err.starts_with("spec.topics:") && err.contains("at most 247"),
            "{pattern:?}: {err}"
        );
    }
    let err = refusal("topics: ['x{246}']\nreplicationPolicy: {type: Prefix, separator: '---'}\n");
    assert!(err.contains("at most 245"), "{err}");
    for accepted in [
        "topics: ['x{247}']\n",
        // Some names are short enough: the run reports the ones the target refuses.
        "topics: ['x{200,300}']\n",
        // Identity keeps the source's names.
        "topics: ['x{249}']\nreplicationPolicy: {type: Identity}\n",
    ] {
        assert!(check(&spec(accepted)).is_ok(), "{accepted:?}");
    }
}
