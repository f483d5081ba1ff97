//! Connecting, migrating and health-checking.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use parlance_ports::{PortError, PortResult};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use url::{Url, form_urlencoded};

use crate::error::port_error;

/// A PostgreSQL connection string whose `Debug` and `Display` hide the
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// Wraps a `postgres://` URL.
    ///
    /// ```
    /// use parlance_postgres::DatabaseUrl;
    ///
    /// let url = DatabaseUrl::new("postgres://app:s3cret@db.example:5432/parlance");
    /// assert_eq!(url.to_string(), "postgres://app:***@db.example:5432/parlance");
    /// assert!(!format!("{url:?}").contains("s3cret"));
    /// assert!(url.expose().contains("s3cret")); // for the driver only
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL itself, secrets included: hand it only to the driver.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with every password replaced by `***`: the userinfo's, and
    /// the `password` and `sslpassword` query parameters (the key file's
    /// passphrase). A string that is not a URL with an authority is shown as
    /// `***` whole.
    pub fn redacted(&self) -> String {
        let Ok(mut url) = Url::parse(&self.0) else {
            return "***".to_owned();
        };
        if url.cannot_be_a_base() {
            return "***".to_owned();
        }
        if url.password().is_some() && url.set_password(Some("***")).is_err() {
            return "***".to_owned();
        }
        if let Some(query) = url.query() {
            // Each pair is kept as written unless its decoded name is secret,
            // so the rest of the query reads as the operator wrote it.
            let query = query
                .split('&')
                .map(|pair| {
                    let (name, _) = pair.split_once('=').unwrap_or((pair, ""));
                    let decoded = form_urlencoded::parse(name.as_bytes())
                        .next()
                        .map(|(n, _)| n.into_owned())
                        .unwrap_or_default();
                    if SECRET_PARAMETERS.contains(&decoded.as_str()) {
                        format!("{name}=***")
                    } else {
                        pair.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("&");
            url.set_query(Some(&query));
        }
        url.into()
    }
}

/// Connection parameters whose values are secrets.
const SECRET_PARAMETERS: [&str; 2] = ["password", "sslpassword"];

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({:?})", self.redacted())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Pool settings.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Most connections held open.
    pub max_connections: u32,
    /// How long a caller waits for a free connection before `Unavailable`.
    pub acquire_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// Opens a pool. Connections are made lazily, so this succeeds while the
/// server is down; [`ping`] tells whether it answers. Call it within a
/// Tokio runtime, which the pool's connections run on.
///
/// A connection is not pinged when it is taken from the pool, only when it
/// goes back (which the driver always does): that saves a round trip per
/// statement. A connection the server dropped while idle fails its next
/// statement with `Unavailable` and is then closed, so after a server
/// restart each idle connection costs at most one failed call.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), parlance_ports::PortError> {
/// use std::time::Duration;
///
/// use parlance_postgres::{DatabaseUrl, PoolOptions};
///
/// let url = DatabaseUrl::new("postgres://app@127.0.0.1:5432/parlance");
/// let options = PoolOptions {
///     max_connections: 8,
///     acquire_timeout: Duration::from_secs(2),
/// };
/// // No connection is made yet, so this works with no server running.
/// let pool = parlance_postgres::connect(&url, &options)?;
/// assert_eq!(pool.options().get_max_connections(), 8);
///
/// // A string that is no connection string is refused at once.
/// let err = parlance_postgres::connect(&DatabaseUrl::new("not a url"), &options).unwrap_err();
/// assert_eq!(err.kind, parlance_ports::ErrorKind::Invalid);
/// # Ok(())
/// # }
/// ```
pub fn connect(url: &DatabaseUrl, options: &PoolOptions) -> PortResult<PgPool> {
    let connect = PgConnectOptions::from_str(url.expose())
        .map_err(|e| PortError::invalid(format!("bad database url {url}")).with_source(e))?;
    Ok(PgPoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(connect))
}

/// Applies every embedded migration not yet applied.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use parlance_postgres::{DatabaseUrl, PoolOptions};
///
/// let url = DatabaseUrl::new(std::env::var("DATABASE_URL")?);
/// let pool = parlance_postgres::connect(&url, &PoolOptions::default())?;
/// parlance_postgres::ping(&pool).await?;
/// // Applied migrations are recorded in the database: running it again, from
/// // any number of processes at once, applies nothing twice.
/// parlance_postgres::migrate(&pool).await?;
/// # Ok(())
/// # }
/// ```
pub async fn migrate(pool: &PgPool) -> PortResult<()> {
    sqlx::migrate!("./migrations")
        .run(pool)
        .await
        .map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => port_error("apply migrations", e),
            other => PortError::other("postgres: apply migrations").with_source(other),
        })
}

/// Checks that the server answers a trivial query.
pub async fn ping(pool: &PgPool) -> PortResult<()> {
    sqlx::query("SELECT 1")
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| port_error("ping", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        let u = DatabaseUrl::new("postgres://app:s3cret@db.example:5432/parlance?sslmode=require");
        assert_eq!(
            u.redacted(),
            "postgres://app:***@db.example:5432/parlance?sslmode=require"
        );
        assert!(!format!("{u:?}").contains("s3cret"));
        assert_eq!(
            DatabaseUrl::new("postgres://postgres@127.0.0.1/test").redacted(),
            "postgres://postgres@127.0.0.1/test"
        );
        assert_eq!(DatabaseUrl::new("garbage").redacted(), "***");
    }

    #[test]
    fn redacts_passwords_given_as_query_parameters() {
        let u = DatabaseUrl::new(
            "postgres://app@db.example/parlance?sslmode=verify-full&password=s3cret\
             &sslpassword=k3y&application_name=parlance",
        );
        assert_eq!(
            u.redacted(),
            "postgres://app@db.example/parlance?sslmode=verify-full&password=***\
             &sslpassword=***&application_name=parlance"
        );
        for shown in [u.to_string(), format!("{u:?}")] {
            assert!(
                !shown.contains("s3cret") && !shown.contains("k3y"),
                "{shown}"
            );
        }
        // Both places at once, an encoded name, and a repeated parameter.
        let u = DatabaseUrl::new(
            "postgresql://app:one@db.example/p?pass%77ord=two&password=three&options=-c%20x",
        );
        assert_eq!(
            u.redacted(),
            "postgresql://app:***@db.example/p?pass%77ord=***&password=***&options=-c%20x"
        );
    }

    #[test]
    fn redacts_what_it_cannot_read_whole() {
        // A key-value connection string is not a URL: nothing of it is shown.
        assert_eq!(
            DatabaseUrl::new("host=db password=s3cret").redacted(),
            "***"
        );
        assert_eq!(DatabaseUrl::new("mailto:s3cret@h").redacted(), "***");
        assert_eq!(
            DatabaseUrl::new("postgress://a:s3cret@h/db").redacted(),
            "postgress://a:***@h/db"
        );
    }
}
