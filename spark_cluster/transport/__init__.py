"""SSH: connections, host keys, ssh_config, and the Node/Fleet that run commands. Knows no inventory."""
