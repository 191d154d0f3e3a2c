//! `[stream_policy]` of the serve settings: which stream URLs the server may open. The
//! settings are the video crate's [`StreamPolicy`] itself (one definition, no mirror); the
//! flags here override its lists.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use peregrine_video::{StreamPolicy, SystemResolver, UrlPolicy};

/// The stream URL policy, as the config file's `[stream_policy]` section spells it.
pub type StreamPolicySettings = StreamPolicy;

/// Flags for [`StreamPolicySettings`]; each replaces the config file's list.
#[derive(Debug, Args, Default)]
pub struct StreamPolicyArgs {
    /// URL schemes a stream may ask for, comma-separated (rtsp, rtsps; rtp and rtp+tcp
    /// for cameras that push, which open a listening port; file streams come
    /// with --stream-file-roots) [default: rtsp,rtsps].
    #[arg(
        long = "stream-allowed-schemes",
        env = "PEREGRINE_STREAM_ALLOWED_SCHEMES",
        value_delimiter = ','
    )]
    pub allowed_schemes: Option<Vec<String>>,
    /// Directories file streams may come from, comma-separated; a file must resolve
    /// (symlinks and `..` followed) to a path under one [default: none, no file streams].
    #[arg(
        long = "stream-file-roots",
        env = "PEREGRINE_STREAM_FILE_ROOTS",
        value_delimiter = ','
    )]
    pub file_roots: Option<Vec<PathBuf>>,
    /// Hosts a camera may be on although loopback, link-local or a metadata address,
    /// comma-separated: CIDRs (127.0.0.0/8), addresses or exact host names [default: none].
    #[arg(
        long = "stream-allow-hosts",
        env = "PEREGRINE_STREAM_ALLOW_HOSTS",
        value_delimiter = ','
    )]
    pub allow_hosts: Option<Vec<String>>,
}

impl StreamPolicyArgs {
    /// An empty value (`--stream-allow-hosts ""`) empties the list.
    pub fn apply(self, s: &mut StreamPolicySettings) {
        if let Some(v) = self.allowed_schemes {
            s.allowed_schemes = v.into_iter().filter(|x| !x.trim().is_empty()).collect();
        }
        if let Some(v) = self.file_roots {
            s.file_roots = v.into_iter().filter(|x| !x.as_os_str().is_empty()).collect();
        }
        if let Some(v) = self.allow_hosts {
            s.allow_hosts = v.into_iter().filter(|x| !x.trim().is_empty()).collect();
        }
    }
}

/// Refuses settings the stream manager could not use (unknown schemes, unparseable hosts,
/// file roots that are not directories), before anything starts.
pub fn validate(s: &StreamPolicySettings) -> Result<()> {
    UrlPolicy::new(s, Arc::new(SystemResolver))
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("stream_policy.{e}"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        policy: StreamPolicyArgs,
    }

    #[test]
    fn comma_lists_replace_the_file_and_empty_empties() {
        let cli = Cli::parse_from([
            "x",
            "--stream-allow-hosts",
            "127.0.0.1,10.9.0.0/16",
            "--stream-file-roots",
            "/tmp",
            "--stream-allowed-schemes",
            "",
        ]);
        let mut s: StreamPolicySettings = toml::from_str("allow_hosts = [\"cam.lan\"]").unwrap();
        cli.policy.apply(&mut s);
        assert_eq!(s.allow_hosts, ["127.0.0.1", "10.9.0.0/16"]);
        assert_eq!(s.file_roots, [PathBuf::from("/tmp")]);
        assert!(s.allowed_schemes.is_empty());
        validate(&s).unwrap();
    }

    #[test]
    fn unusable_settings_are_refused_with_the_setting_named() {
        for (toml_text, want) in [
            ("allowed_schemes = [\"http\"]", "stream_policy.allowed_schemes"),
            ("file_roots = [\"/no/such/dir\"]", "stream_policy.file_roots"),
            ("allow_hosts = [\"10.0.0.0/99\"]", "stream_policy.allow_hosts"),
        ] {
            let s: StreamPolicySettings = toml::from_str(toml_text).unwrap();
            let e = validate(&s).unwrap_err().to_string();
            assert!(e.contains(want), "{toml_text}: {e}");
        }
        assert_eq!(StreamPolicySettings::default().allowed_schemes, ["rtsp", "rtsps"]);
    }
}
