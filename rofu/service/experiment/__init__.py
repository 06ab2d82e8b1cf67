"""Holdout experiments: rofu against a control group (`rofu.service.deciding.holdout`)."""
