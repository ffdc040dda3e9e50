//! Log lines of the daemon and the CLI (`tracing`): where they go and in what form. One
//! subscriber per process, installed by `main` before anything logs: text or JSON lines on
//! stderr, filtered by `--log-level` (or `RUST_LOG`; the same directive syntax), `info` by
//! default. Output meant for the user (a command's results, progress lines, errors that end
//! a command) is not a log line and stays on stdout/stderr as it is.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// `--log-level` when neither it nor `RUST_LOG` is given.
pub const DEFAULT_FILTER: &str = "info,rmcp=warn";

/// The logging flags every Sandcell binary takes.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Which log lines to write: a level (error, warn, info, debug, trace) or filter
    /// directives such as `info,sandcell_server=debug`. (The MCP SDK's info lines, a whole
    /// handshake per session and every notification, are left out by default.)
    #[arg(
        long,
        global = true,
        env = "RUST_LOG",
        default_value = DEFAULT_FILTER,
        value_name = "FILTER"
    )]
    pub log_level: String,
    /// The form of log lines on stderr
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Installs the process's subscriber. A filter that does not parse is reported on stderr
/// and replaced by `info` rather than failing the command.
pub fn init(args: &LogArgs) {
    let filter = EnvFilter::try_new(&args.log_level).unwrap_or_else(|e| {
        eprintln!(
            "sandcell: --log-level {:?}: {e}; using info",
            args.log_level
        );
        EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    // A subscriber already installed (a test that set its own) stays.
    let _ = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
        #[arg(long)]
        other: bool,
    }

    #[test]
    fn flags_parse_and_filters_are_checked() {
        let cli =
            Cli::try_parse_from(["t", "--log-format", "json", "--log-level", "debug"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
        assert_eq!(cli.log.log_level, "debug");
        assert!(!cli.other);
        assert!(Cli::try_parse_from(["t", "--log-format", "xml"]).is_err());
        assert!(EnvFilter::try_new("info,sandcell_server=debug").is_ok());
        // Installing twice (or after a test's own subscriber) is not an error.
        init(&cli.log);
        init(&cli.log);
    }
}
