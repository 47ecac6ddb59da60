//! The image rule: which host executable a container image stands for.
//!
//! There is no image store here. An image reference is matched against an ordered list of
//! rules (the `--image-map` file's rules first, then the built-in defaults); the first rule
//! whose glob matches decides. See the README for the file format.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// What a matching image runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The image has one entrypoint: this host executable.
    Binary(PathBuf),
    /// The image is "a shell": `command[0]` is looked up on the host `PATH`.
    HostCommand,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub image: String,
    pub target: Target,
}

/// One rule as written in the image-map file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RuleFile {
    image: String,
    #[serde(default, alias = "executable")]
    binary: Option<PathBuf>,
    #[serde(default)]
    host_command: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MapFile {
    #[serde(default)]
    mirrorflow_binary: Option<PathBuf>,
    #[serde(default)]
    rules: Vec<RuleFile>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageMapError {
    #[error("cannot read image map {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse image map {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "image map {path}: rule for {image:?} must set exactly one of `binary` and `hostCommand`"
    )]
    BadRule { path: PathBuf, image: String },
}

/// The ordered rule list plus where it came from (named in `ImageNotMapped` messages).
#[derive(Clone, Debug)]
pub struct ImageMap {
    pub rules: Vec<Rule>,
    pub source: String,
}

/// A bare name: images whose repository's last path segment is `mirrorflow`.
const MIRRORFLOW_GLOBS: &[&str] = &["mirrorflow"];
const HOST_COMMAND_GLOBS: &[&str] = &[
    "busybox*",
    "*/busybox*",
    "alpine*",
    "*/alpine*",
    "*/shell:*",
];

pub fn default_rules(mirrorflow_binary: &Path) -> Vec<Rule> {
    let mirrorflow = MIRRORFLOW_GLOBS.iter().map(|g| Rule {
        image: (*g).to_string(),
        target: Target::Binary(mirrorflow_binary.to_path_buf()),
    });
    let shells = HOST_COMMAND_GLOBS.iter().map(|g| Rule {
        image: (*g).to_string(),
        target: Target::HostCommand,
    });
    mirrorflow.chain(shells).collect()
}

impl ImageMap {
    /// Loads `path` (if given): its rules come first, the defaults after them. A relative
    /// `binary` is taken relative to the map file's directory.
    pub fn load(path: Option<&Path>, mirrorflow_binary: &Path) -> Result<Self, ImageMapError> {
        let Some(path) = path else {
            return Ok(Self {
                rules: default_rules(mirrorflow_binary),
                source: "the built-in image rules".to_string(),
            });
        };
        let text = std::fs::read_to_string(path).map_err(|source| ImageMapError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path, mirrorflow_binary)
    }

    fn parse(text: &str, path: &Path, mirrorflow_binary: &Path) -> Result<Self, ImageMapError> {
        let file: MapFile = if text.trim().is_empty() {
            MapFile {
                mirrorflow_binary: None,
                rules: Vec::new(),
            }
        } else {
            serde_yaml::from_str(text).map_err(|source| ImageMapError::Parse {
                path: path.to_path_buf(),
                source,
            })?
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let mut rules = Vec::new();
        for r in file.rules {
            let target = match (r.binary, r.host_command) {
                (Some(b), false) => Target::Binary(resolve(b)),
                (None, true) => Target::HostCommand,
                _ => {
                    return Err(ImageMapError::BadRule {
                        path: path.to_path_buf(),
                        image: r.image,
                    });
                }
            };
            rules.push(Rule {
                image: r.image,
                target,
            });
        }
        let mirrorflow = file
            .mirrorflow_binary
            .map(resolve)
            .unwrap_or_else(|| mirrorflow_binary.to_path_buf());
        rules.extend(default_rules(&mirrorflow));
        Ok(Self {
            rules,
            source: format!("image map {} (then the built-in rules)", path.display()),
        })
    }

    pub fn resolve(&self, image: &str) -> Option<&Target> {
        self.rules
            .iter()
            .find(|r| image_matches(&r.image, image))
            .map(|r| &r.target)
    }
}

/// The command line a container runs: `(program, args)`.
///
/// For a binary image the binary replaces `command[0]` (or is the whole command when
/// `command` is empty); for a host-command image `command[0]` is the program, and an empty
/// command means `sh` (busybox's default entrypoint).
pub fn command_line(target: &Target, command: &[String], args: &[String]) -> (String, Vec<String>) {
    match target {
        Target::Binary(bin) => {
            let rest = command.iter().skip(1).chain(args).cloned().collect();
            (bin.to_string_lossy().into_owned(), rest)
        }
        Target::HostCommand => match command.split_first() {
            Some((program, rest)) => (program.clone(), rest.iter().chain(args).cloned().collect()),
            None => match args.split_first() {
                Some((program, rest)) => (program.clone(), rest.to_vec()),
                None => ("sh".to_string(), Vec::new()),
            },
        },
    }
}

/// A rule's `image` against an image reference: a bare name (no `*?:/@`) matches images
/// whose repository's last path segment is that name (`mirrorflow` matches
/// `ghcr.io/x/mirrorflow:0.1`); anything else is a glob over the whole reference.
pub fn image_matches(pattern: &str, image: &str) -> bool {
    if pattern.contains(['*', '?', ':', '/', '@']) {
        glob_match(pattern, image)
    } else {
        repository_name(image) == pattern
    }
}

/// `ghcr.io:5000/x/mirrorflow:0.1@sha256:..` -> `mirrorflow`.
pub fn repository_name(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split(':').next().unwrap_or(last)
}

/// Shell-style glob: `*` matches any run of characters (including `/`), `?` one character.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> ImageMap {
        ImageMap::load(None, Path::new("/bin/mf")).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn globs() {
        assert!(glob_match("busybox*", "busybox:stable"));
        assert!(glob_match("*/mirrorflow:*", "ghcr.io/x/mirrorflow:0.1"));
        assert!(!glob_match("*/mirrorflow:*", "ghcr.io/x/mirrorflow-ui:0.1"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
    }

    #[test]
    fn bare_names_match_the_repository() {
        assert_eq!(
            repository_name("ghcr.io:5000/x/mirrorflow:0.1@sha256:ab"),
            "mirrorflow"
        );
        assert_eq!(repository_name("busybox"), "busybox");
        assert!(image_matches("mirrorflow", "ghcr.io/x/mirrorflow:0.1"));
        assert!(image_matches("mirrorflow", "mirrorflow"));
        assert!(!image_matches("mirrorflow", "mirrorflow-ui:1"));
        assert!(image_matches("mirrorflow:*", "mirrorflow:dev"));
    }

    #[test]
    fn default_rules_map_mirrorflow_and_shells() {
        let m = defaults();
        let bin = Target::Binary(PathBuf::from("/bin/mf"));
        for image in [
            "mirrorflow:dev",
            "ghcr.io/x/mirrorflow:0.1",
            "mirrorflow",
            "r/mirrorflow@sha256:ab",
        ] {
            assert_eq!(m.resolve(image), Some(&bin), "{image}");
        }
        for image in [
            "busybox:stable",
            "docker.io/library/busybox:1.36",
            "alpine:3",
            "x/shell:1",
        ] {
            assert_eq!(m.resolve(image), Some(&Target::HostCommand), "{image}");
        }
        assert_eq!(m.resolve("nginx:latest"), None);
        assert_eq!(m.resolve("ghcr.io/x/mirrorflow-ui:1"), None);
    }

    #[test]
    fn file_rules_come_first_and_resolve_relative_paths() {
        let text = "mirrorflowBinary: ../target/debug/mirrorflow\nrules:\n  - image: 'nginx*'\n    hostCommand: true\n  - image: 'busybox:special'\n    binary: bin/special\n  - image: tool\n    executable: /opt/tool\n";
        let m = ImageMap::parse(text, Path::new("/w/e2e/map.yaml"), Path::new("/x"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.resolve("nginx:1"), Some(&Target::HostCommand));
        assert_eq!(
            m.resolve("busybox:special"),
            Some(&Target::Binary(PathBuf::from("/w/e2e/bin/special")))
        );
        assert_eq!(
            m.resolve("mirrorflow:1"),
            Some(&Target::Binary(PathBuf::from(
                "/w/e2e/../target/debug/mirrorflow"
            )))
        );
        assert_eq!(
            m.resolve("r.io/tool:2"),
            Some(&Target::Binary(PathBuf::from("/opt/tool")))
        );
        let bad = "rules:\n  - image: x\n";
        assert!(ImageMap::parse(bad, Path::new("/m.yaml"), Path::new("/x")).is_err());
    }

    #[test]
    fn command_lines() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let bin = Target::Binary(PathBuf::from("/bin/mf"));
        assert_eq!(
            command_line(&bin, &[], &s(&["operator", "-v"])),
            ("/bin/mf".to_string(), s(&["operator", "-v"]))
        );
        assert_eq!(
            command_line(&bin, &s(&["mirrorflow", "replicate"]), &s(&["--x"])),
            ("/bin/mf".to_string(), s(&["replicate", "--x"]))
        );
        assert_eq!(
            command_line(&Target::HostCommand, &s(&["sh", "-c"]), &s(&["echo hi"])),
            ("sh".to_string(), s(&["-c", "echo hi"]))
        );
        assert_eq!(
            command_line(&Target::HostCommand, &[], &[]),
            ("sh".to_string(), Vec::new())
        );
    }
}
