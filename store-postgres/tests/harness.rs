//! The test harness itself: a server of its own, databases that are really
//! separate, and nothing left behind once it is dropped.

use std::net::TcpStream;
use store_postgres::testkit::PostgresServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_server_stops_and_leaves_nothing_behind() {
    let server = PostgresServer::start().expect("start a server");
    let (port, directory) = (server.port(), server.directory().to_owned());
    assert_ne!(port, 5432, "the harness must never use the system server's port");
    let first = server.create_database().await.expect("first database");
    let second = server.create_database().await.expect("second database");
    assert_ne!(first.name, second.name);
    let (client, connection) = tokio_postgres::connect(&first.url, tokio_postgres::NoTls)
        .await
        .expect("connect to the new database");
    let driver = tokio::spawn(connection);
    let row = client
        .query_one("SELECT current_database(), inet_server_addr()::text", &[])
        .await
        .expect("query");
    assert_eq!(row.get::<_, String>(0), first.name);
    assert_eq!(row.get::<_, String>(1), "127.0.0.1/32");
    drop(client);
    let _ = driver.await;
    assert!(directory.join("data").is_dir());
    drop(server);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server still accepts connections after drop"
    );
    // The watchdog, ended by the drop, must not be what removes the
    // directory: the TempDir does, at once.
    assert!(!directory.exists(), "{} survived the drop", directory.display());
}
