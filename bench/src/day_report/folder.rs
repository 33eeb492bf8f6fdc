//! Reading a run's folder: which file holds what, and a growth folder's
//! sizes. The parsing itself is in [`super::parse`].

use super::parse::{self, LoadFigures, ParseError, PreloadFigures, RESTARTS_FILE, SAMPLES_FILE, SCENARIO_FILE};
use super::summary::DayInputs;
use std::path::{Path, PathBuf};

/// `idem-bench preload --json` of the run.
pub const PRELOAD_FILE: &str = "preload.json";
/// `idem-bench http --json` of the steady rate on an empty store.
pub const EMPTY_STEADY_FILE: &str = "empty-steady.json";
/// ... of the peak rate on an empty store.
pub const EMPTY_PEAK_FILE: &str = "empty-peak.json";
/// ... of the steady rate on the loaded store.
pub const STEADY_FILE: &str = "steady.json";
/// ... of the peak rate on the loaded store.
pub const PEAK_FILE: &str = "peak.json";
/// A growth folder holds one run folder per size, named `size-N`.
pub const SIZE_FOLDER_PREFIX: &str = "size-";

#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: not JSON: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{folder}: {source}")]
    Parse { folder: String, source: ParseError },
}

fn read_text(path: &Path) -> Result<Option<String>, FolderError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FolderError::Read {
            path: path.display().to_string(),
            source,
        }),
    }
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, FolderError> {
    let Some(text) = read_text(path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| FolderError::Json {
            path: path.display().to_string(),
            source,
        })
}

fn parsed<T>(folder: &Path, result: Result<T, ParseError>) -> Result<T, FolderError> {
    result.map_err(|source| FolderError::Parse {
        folder: folder.display().to_string(),
        source,
    })
}

/// An http report's figures, when the file is there (a run that ended
/// early, or a growth size, has no peak).
fn load_file(folder: &Path, name: &str) -> Result<Option<LoadFigures>, FolderError> {
    match read_json(&folder.join(name))? {
        None => Ok(None),
        Some(report) => parsed(folder, parse::load_figures(name, &report)).map(Some),
    }
}

fn preload_file(folder: &Path) -> Result<Option<PreloadFigures>, FolderError> {
    match read_json(&folder.join(PRELOAD_FILE))? {
        None => Ok(None),
        Some(report) => parsed(folder, parse::preload_figures(PRELOAD_FILE, &report)).map(Some),
    }
}

/// Everything a run folder holds; only `scenario.txt` must be there.
pub fn read_day(folder: &Path) -> Result<DayInputs, FolderError> {
    let scenario_path = folder.join(SCENARIO_FILE);
    let scenario_text = read_text(&scenario_path)?.ok_or_else(|| FolderError::Read {
        path: scenario_path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a day-of-keys folder"),
    })?;
    let samples = match read_text(&folder.join(SAMPLES_FILE))? {
        Some(text) => parsed(folder, parse::parse_samples(&text))?,
        None => Vec::new(),
    };
    let restarts = match read_text(&folder.join(RESTARTS_FILE))? {
        Some(text) => parsed(folder, parse::parse_restarts(&text))?,
        None => Vec::new(),
    };
    Ok(DayInputs {
        scenario: parsed(folder, parse::parse_scenario(&scenario_text))?,
        preload: preload_file(folder)?,
        empty_steady: load_file(folder, EMPTY_STEADY_FILE)?,
        empty_peak: load_file(folder, EMPTY_PEAK_FILE)?,
        steady: load_file(folder, STEADY_FILE)?,
        peak: load_file(folder, PEAK_FILE)?,
        samples,
        restarts,
    })
}

/// The `size-N` folders of a growth folder, smallest N first; empty when
/// `folder` is a single run's.
pub fn size_folders(folder: &Path) -> Result<Vec<PathBuf>, FolderError> {
    let entries = std::fs::read_dir(folder).map_err(|source| FolderError::Read {
        path: folder.display().to_string(),
        source,
    })?;
    let mut sizes: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.path().is_dir())
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_owned();
            let size = name.strip_prefix(SIZE_FOLDER_PREFIX)?.parse().ok()?;
            Some((size, entry.path()))
        })
        .collect();
    sizes.sort();
    Ok(sizes.into_iter().map(|(_, path)| path).collect())
}

/// Every size of a growth folder, each with the empty-store reference the
/// growth folder holds once for all of them.
pub fn read_growth(folder: &Path, sizes: &[PathBuf]) -> Result<Vec<DayInputs>, FolderError> {
    let empty_steady = load_file(folder, EMPTY_STEADY_FILE)?;
    sizes
        .iter()
        .map(|size| {
            let mut inputs = read_day(size)?;
            inputs.empty_steady = inputs.empty_steady.or(empty_steady);
            Ok(inputs)
        })
        .collect()
}
