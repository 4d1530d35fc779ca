"""Development tooling: Maven jar fetching and the embedded test server. Not part of the library."""
