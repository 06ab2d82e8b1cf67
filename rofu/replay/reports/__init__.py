"""The replay's reports: statistics over paired seeds, tables, regret and bonus curves."""
