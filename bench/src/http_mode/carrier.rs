//! The carrier simulator's stats: purchases per parcel and per carrier key.

use super::audit::{CarrierStats, Parcel};
use serde::Deserialize;
use std::collections::HashMap;

/// Path of the simulator's stats endpoint.
pub const STATS_PATH: &str = "/carrier/v1/stats";

#[derive(Debug, Deserialize)]
struct StatsBody {
    purchases_by_carrier_key: HashMap<String, u64>,
    purchases_by_parcel: Vec<ParcelPurchases>,
}

#[derive(Debug, Deserialize)]
struct ParcelPurchases {
    order_id: u64,
    parcel_no: u32,
    label_version: u32,
    purchases: u64,
}

pub async fn fetch_stats(admin: &reqwest::Client, carrier_url: &str) -> Result<CarrierStats, String> {
    let response = admin
        .get(format!("{carrier_url}{STATS_PATH}"))
        .send()
        .await
        .map_err(|error| error.to_string())?;
    if !response.status().is_success() {
        return Err(format!("GET {STATS_PATH} answered {}", response.status()));
    }
    let bytes = response.bytes().await.map_err(|error| error.to_string())?;
    parse_stats(&bytes)
}

pub fn parse_stats(bytes: &[u8]) -> Result<CarrierStats, String> {
    let body: StatsBody =
        serde_json::from_slice(bytes).map_err(|error| format!("stats are not as expected: {error}"))?;
    let mut stats = CarrierStats {
        purchases_by_key: body.purchases_by_carrier_key,
        ..CarrierStats::default()
    };
    for parcel in body.purchases_by_parcel {
        let key = Parcel {
            order_id: parcel.order_id,
            parcel_no: parcel.parcel_no,
            label_version: parcel.label_version,
        };
        *stats.purchases_by_parcel.entry(key).or_insert(0) += parcel.purchases;
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulators_stats_are_read_per_parcel_and_per_key() {
        let body = br#"{
            "requests_total": 5, "purchases_total": 3, "deduplicated_repeats": 1,
            "in_progress_answers": 0, "errors_injected": 0, "replies_dropped": 1,
            "purchases_by_carrier_key": {"carrier:demo:aa": 1, "carrier:demo:bb": 2},
            "purchases_by_parcel": [
                {"order_id": 918273, "parcel_no": 1, "label_version": 1, "purchases": 2},
                {"order_id": 918273, "parcel_no": 2, "label_version": 1, "purchases": 1}
            ]
        }"#;
        let stats = parse_stats(body).unwrap();
        let parcel = |parcel_no| Parcel {
            order_id: 918_273,
            parcel_no,
            label_version: 1,
        };
        assert_eq!(stats.purchases_by_parcel[&parcel(1)], 2);
        assert_eq!(stats.purchases_by_parcel[&parcel(2)], 1);
        assert_eq!(stats.purchases_by_key["carrier:demo:bb"], 2);
        assert!(parse_stats(b"{}").is_err());
    }
}
