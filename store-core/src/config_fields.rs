//! What the backends' config types share when they are read from the
//! server's config file (`[store.*]` sections, deserialised straight into
//! each store crate's own config type).

use serde::{Deserialize, Deserializer};

/// An optional setting that a config file writes as a string, where the
/// empty string means "not set" (`ca_file = ""`), as every idem config file
/// and `IDEM__…` override writes it.
pub fn empty_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: From<String>,
{
    let text = String::deserialize(deserializer)?;
    Ok((!text.is_empty()).then(|| T::from(text)))
}
