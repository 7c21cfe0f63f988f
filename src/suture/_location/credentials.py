"""Where the drivers would find credentials for a scheme, said in an error's last sentence.

suture never reads credentials; it only looks whether the places the drivers read exist, so
that a failed gs:// or s3:// request can say "no GCS credentials were found" and how to give
them, instead of a generic "check the credentials". HTTP(S) takes none.

Example:
    >>> credentials_hint("https")
    'Check the URL, and that the server serves it.'
"""

from __future__ import annotations

import os
from pathlib import Path


def credentials_hint(scheme: str) -> str:
    """The sentence that ends an access error for `scheme` ("gs", "s3", "http", "https")."""
    if scheme == "gs":
        source = _gcs_source()
        if source:
            return f"Check the path, and that the GCS credentials in use ({source}) may read it."
        return (
            f"No GCS credentials were found (GOOGLE_APPLICATION_CREDENTIALS is not set, and "
            f"there is no {_gcloud_file()}), so the request went without them, which reads "
            f"public buckets only. Check the path; for a private bucket run `gcloud auth "
            f"application-default login`, set GOOGLE_APPLICATION_CREDENTIALS to a service "
            f"account's key file, or run on a Google Cloud machine (its metadata server)."
        )
    if scheme == "s3":
        source = _s3_source()
        if source:
            return f"Check the path, and that the AWS credentials in use ({source}) may read it."
        return (
            "No AWS credentials were found (AWS_ACCESS_KEY_ID is not set, and there is no "
            f"{_aws_file('AWS_SHARED_CREDENTIALS_FILE', 'credentials')}), so the request went "
            "without them, which reads public buckets only. Check the path; set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, run `aws configure`, or run on a "
            "machine with an instance role."
        )
    return "Check the URL, and that the server serves it."


def _gcloud_file() -> Path:
    folder = os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud"
    return Path(folder) / "application_default_credentials.json"


def _gcs_source() -> str:
    """Where TensorStore's GCS driver takes credentials from, in its order; "" if nowhere
    but the metadata server of a Google Cloud machine (which is not asked here)."""
    if os.environ.get("GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        return "GOOGLE_AUTH_TOKEN_FOR_TESTING"
    named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named and Path(named).is_file():
        return "GOOGLE_APPLICATION_CREDENTIALS"
    return str(_gcloud_file()) if _gcloud_file().is_file() else ""


def _aws_file(variable: str, name: str) -> Path:
    return Path(os.environ.get(variable) or Path.home() / ".aws" / name)


def _s3_source() -> str:
    """Where the AWS credential chain would find credentials; "" if nowhere but an
    instance role (not asked here)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return "AWS_ACCESS_KEY_ID"
    for variable in ("AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(variable):
            return variable
    for variable, name in (
        ("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        ("AWS_CONFIG_FILE", "config"),
    ):
        if _aws_file(variable, name).is_file():
            return str(_aws_file(variable, name))
    return ""
