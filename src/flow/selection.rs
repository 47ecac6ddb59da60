//! Selections that can match nothing or contradict themselves, found from the spec alone,
//! before anything is deployed.
//!
//! What is decided exactly: the names a pattern can match when they are few (a literal, an
//! alternation of literals, small character classes and bounded repeats: at most
//! [`MAX_NAMES`]), whether a pattern can match any legal Kafka topic name at all (its
//! characters and its shortest and longest match), and whether an exclude pattern is
//! "anything" (`.*`, `.+`, `[\w.-]+`...). A finite include pattern whose every name an exclude
//! pattern removes is a contradiction. Containment of one unbounded pattern in another is not
//! decided here (a wrong "contradiction" would refuse a valid flow); those selections get the
//! probe's answer instead (no source topic or group matched).

use regex_syntax::hir::{Class, Hir, HirKind, Look};

use super::FlowError;
use crate::api::{MirrorFlowSpec, PolicyKind};

/// The most names a pattern is expanded to; a pattern naming more is treated as unbounded.
pub const MAX_NAMES: usize = 64;
/// Kafka's longest topic name.
const MAX_TOPIC_NAME: usize = 249;
/// The compiled size of one exclude pattern used to test names (the filters' own limit).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// What a list selects: topic names have a grammar, group names have none.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Names {
    Topics,
    Groups,
}

impl Names {
    fn noun(self) -> &'static str {
        match self {
            Names::Topics => "topic",
            Names::Groups => "consumer group",
        }
    }

    fn fate(self) -> &'static str {
        match self {
            Names::Topics => "copied",
            Names::Groups => "checkpointed",
        }
    }
}

/// The contradictions of `spec.topics`/`spec.topicsExclude`, and of `spec.groups`/
/// `spec.groupsExclude` when checkpoints are on (otherwise the groups are not used).
pub fn check(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    check_lists(
        Names::Topics,
        ("spec.topics", &spec.topics),
        ("spec.topicsExclude", &spec.topics_exclude),
    )?;
    check_remote_names(spec)?;
    if spec.checkpoints.enabled {
        check_lists(
            Names::Groups,
            ("spec.groups", &spec.groups),
            ("spec.groupsExclude", &spec.groups_exclude),
        )?;
    }
    Ok(())
}

/// Under `Prefix` a remote topic is named `<source alias><separator><topic>`, which Kafka
/// refuses past 249 characters: a pattern whose every name is too long for that can never be
/// copied (a pattern with shorter names too is left to the run, which reports each topic the
/// target refuses).
fn check_remote_names(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    if spec.replication_policy.kind != PolicyKind::Prefix {
        return Ok(());
    }
    let separator = spec
        .replication_policy
        .separator
        .as_deref()
        .unwrap_or(mirrorflow_core::DEFAULT_SEPARATOR);
    let prefix = spec.source.alias.len().saturating_add(separator.len());
    let longest_source_name = MAX_TOPIC_NAME.saturating_sub(prefix);
    for pattern in &spec.topics {
        let Some(shortest) = parse(pattern).and_then(|hir| hir.properties().minimum_len()) else {
            continue;
        };
        if shortest > longest_source_name {
            return Err(invalid(
                "spec.topics",
                format!(
                    "'{pattern}' matches only names of {shortest} or more characters, and their remote names ('{}{separator}' and the name) would pass Kafka's {MAX_TOPIC_NAME}: with this alias and separator a source topic name can have at most {longest_source_name}; use a shorter spec.source.alias or spec.replicationPolicy.separator, or type Identity",
                    spec.source.alias
                ),
            ));
        }
    }
    Ok(())
}

type List<'a> = (&'static str, &'a [String]);

fn check_lists(names: Names, include: List, exclude: List) -> Result<(), FlowError> {
    let (include_field, includes) = include;
    let (exclude_field, excludes) = exclude;
    let noun = names.noun();
    if includes.is_empty() {
        return Err(invalid(
            include_field,
            format!(
                "the list is empty, so the flow selects no {noun}; list patterns (regular expressions matched against the whole name, `.*` for all), remove the field for the default, or (groups) set spec.checkpoints.enabled: false to copy records without checkpoints"
            ),
        ));
    }
    let parsed_excludes: Vec<(&str, Option<Hir>)> =
        excludes.iter().map(|p| (p.as_str(), parse(p))).collect();
    if let Some((pattern, _)) = parsed_excludes
        .iter()
        .find(|(_, hir)| hir.as_ref().is_some_and(matches_anything))
    {
        return Err(invalid(
            exclude_field,
            format!(
                "'{pattern}' removes every {noun} name, so {include_field} can select nothing; remove it, or narrow it to the names to leave out"
            ),
        ));
    }
    let compiled: Vec<(&str, regex::Regex)> = excludes
        .iter()
        .filter_map(|p| Some((p.as_str(), anchored(p)?)))
        .collect();
    for pattern in includes {
        // An invalid pattern is the filters' to report, with their own message.
        let Some(hir) = parse(pattern) else {
            continue;
        };
        if names == Names::Topics && !can_match_a_topic(&hir) {
            return Err(invalid(
                include_field,
                format!(
                    "'{pattern}' can match no Kafka topic name (1 to {MAX_TOPIC_NAME} characters of a-z, A-Z, 0-9, '.', '_' and '-'); patterns are regular expressions matched against the whole name (`orders.*` for every name that starts with orders)"
                ),
            ));
        }
        let Some(listed) = finite_names(&hir) else {
            continue;
        };
        let fields = (include_field, exclude_field, names.fate());
        if let Some(message) = all_excluded(pattern, &listed, &compiled, fields) {
            return Err(invalid(exclude_field, message));
        }
    }
    Ok(())
}

/// The message when every name of `listed` (what the include pattern `pattern` matches) is
/// removed by an exclude pattern; `None` when one survives.
fn all_excluded(
    pattern: &str,
    listed: &[String],
    excludes: &[(&str, regex::Regex)],
    (include_field, exclude_field, fate): (&str, &str, &str),
) -> Option<String> {
    let mut by = Vec::new();
    for name in listed {
        let (exclude, _) = excludes.iter().find(|(_, re)| re.is_match(name))?;
        if !by.contains(exclude) {
            by.push(*exclude);
        }
    }
    let excluded_by = by
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(match listed {
        [one] => format!(
            "'{one}' is selected by {include_field} '{pattern}' and removed by {exclude_field} {excluded_by}, so it is never {fate}; remove it from one of the lists"
        ),
        _ => format!(
            "every name {include_field} '{pattern}' selects ({}) is removed by {exclude_field} {excluded_by}, so the pattern selects nothing; remove it from one of the lists",
            listed.join(", ")
        ),
    })
}

fn invalid(field: &'static str, message: String) -> FlowError {
    FlowError::Invalid { field, message }
}

fn parse(pattern: &str) -> Option<Hir> {
    regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .ok()
}

fn anchored(pattern: &str) -> Option<regex::Regex> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .ok()
}

/// The characters of legal topic names.
fn legal_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Whether some name of legal topic characters, 1 to 249 long, may match. Sound in the
/// "no" direction: `false` only when no topic name can match.
fn can_match_a_topic(hir: &Hir) -> bool {
    let props = hir.properties();
    let too_long = props.minimum_len().is_none_or(|n| n > MAX_TOPIC_NAME);
    let only_empty = props.maximum_len() == Some(0);
    !too_long && !only_empty && legal_alphabet(hir)
}

/// Whether the pattern can match a string of legal topic characters (the empty string
/// included).
fn legal_alphabet(hir: &Hir) -> bool {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => true,
        HirKind::Literal(l) => {
            std::str::from_utf8(&l.0).is_ok_and(|s| s.chars().all(legal_topic_char))
        }
        HirKind::Class(c) => class_chars(c).any(legal_topic_char),
        HirKind::Repetition(r) => r.min == 0 || legal_alphabet(&r.sub),
        HirKind::Capture(c) => legal_alphabet(&c.sub),
        HirKind::Concat(subs) => subs.iter().all(legal_alphabet),
        HirKind::Alternation(subs) => subs.iter().any(legal_alphabet),
    }
}

/// The characters of a class that matter here: the legal topic characters it holds (a class
/// is tested for those only, so a large Unicode class costs no more than 65 tests).
fn class_chars(class: &Class) -> impl Iterator<Item = char> + '_ {
    const LEGAL: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    LEGAL.chars().filter(move |c| match class {
        Class::Unicode(u) => u.ranges().iter().any(|r| (r.start()..=r.end()).contains(c)),
        Class::Bytes(b) => b.ranges().iter().any(|r| {
            let byte = u32::from(*c);
            (u32::from(r.start())..=u32::from(r.end())).contains(&byte)
        }),
    })
}

/// Whether the pattern matches every name made of legal topic characters: an unbounded
/// repeat (at least 0 or 1) of a class holding all of them, possibly captured or anchored.
fn matches_anything(hir: &Hir) -> bool {
    match hir.kind() {
        HirKind::Capture(c) => matches_anything(&c.sub),
        HirKind::Alternation(subs) => subs.iter().any(matches_anything),
        HirKind::Concat(subs) => {
            let mut rest = subs.iter().filter(|h| !is_edge_anchor(h));
            matches!((rest.next(), rest.next()), (Some(only), None) if matches_anything(only))
        }
        HirKind::Repetition(r) => {
            r.min <= 1
                && r.max.is_none()
                && match r.sub.kind() {
                    HirKind::Class(c) => class_chars(c).count() == 65,
                    _ => false,
                }
        }
        _ => false,
    }
}

fn is_edge_anchor(hir: &Hir) -> bool {
    matches!(
        hir.kind(),
        HirKind::Look(Look::Start | Look::End | Look::StartLF | Look::EndLF)
    )
}

/// Every name the pattern matches, when they are at most [`MAX_NAMES`] (anchors at its edges
/// are no-ops: patterns match whole names anyway).
fn finite_names(hir: &Hir) -> Option<Vec<String>> {
    let names = match hir.kind() {
        HirKind::Empty => vec![String::new()],
        HirKind::Look(Look::Start | Look::End | Look::StartLF | Look::EndLF) => {
            vec![String::new()]
        }
        HirKind::Look(_) => return None,
        HirKind::Literal(l) => vec![String::from_utf8(l.0.to_vec()).ok()?],
        HirKind::Class(c) => class_names(c)?,
        HirKind::Capture(c) => finite_names(&c.sub)?,
        HirKind::Alternation(subs) => {
            let mut all = Vec::new();
            for s in subs {
                for n in finite_names(s)? {
                    if !all.contains(&n) {
                        all.push(n);
                    }
                }
                if all.len() > MAX_NAMES {
                    return None;
                }
            }
            all
        }
        HirKind::Concat(subs) => {
            let mut all = vec![String::new()];
            for s in subs {
                all = product(&all, &finite_names(s)?)?;
            }
            all
        }
        HirKind::Repetition(r) => {
            let max = r.max.filter(|&m| m <= 8)?;
            let one = finite_names(&r.sub)?;
            let mut all = Vec::new();
            let mut current = vec![String::new()];
            for count in 0..=max {
                if count >= r.min {
                    all.extend(current.iter().cloned());
                }
                current = product(&current, &one)?;
            }
            all.dedup();
            (all.len() <= MAX_NAMES).then_some(all)?
        }
    };
    (names.len() <= MAX_NAMES).then_some(names)
}

fn product(left: &[String], right: &[String]) -> Option<Vec<String>> {
    if left.len().saturating_mul(right.len()) > MAX_NAMES {
        return None;
    }
    Some(
        left.iter()
            .flat_map(|l| right.iter().map(move |r| format!("{l}{r}")))
            .collect(),
    )
}

/// The characters of a small class (at most [`MAX_NAMES`]), as one-character names.
fn class_names(class: &Class) -> Option<Vec<String>> {
    let mut out = Vec::new();
    match class {
        Class::Unicode(u) => {
            for r in u.ranges() {
                for c in r.start()..=r.end() {
                    out.push(c.to_string());
                    if out.len() > MAX_NAMES {
                        return None;
                    }
                }
            }
        }
        Class::Bytes(b) => {
            for r in b.ranges() {
                for byte in r.start()..=r.end() {
                    out.push(char::from(byte).to_string());
                    if out.len() > MAX_NAMES {
                        return None;
                    }
                }
            }
        }
    }
    Some(out)
}

#[cfg(test)]
#[path = "selection_tests.rs"]
mod tests;
