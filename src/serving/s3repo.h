/*
 * s3repo.h - a model repository in an S3-compatible object store (AWS S3, Ceph RGW, MinIO),
 * mirrored into a local directory that the repository scanner (repo.h) reads as it reads
 * any other.
 *
 * `--model-repository s3://BUCKET/PREFIX`: the objects under PREFIX are the repository's
 * files (<model>/config.json, <model>/<version>/<file>). A sync lists them (ListObjectsV2,
 * every page), downloads the ones that are new or whose ETag changed into the mirror
 * (streamed to a .part file, its size and, for single-part uploads, its MD5 checked against
 * the listing's ETag before it is renamed into place), and deletes the files whose objects
 * are gone. Object keys become paths only after a check: no empty, "." or ".." segment, no
 * control byte or backslash, bounded length and depth. What a sync downloaded is recorded
 * in a manifest next to the mirror, so a restart downloads only what changed.
 *
 * Credentials and endpoint come from the environment, as the AWS tools read them:
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (optional), AWS_REGION or
 * AWS_DEFAULT_REGION (default us-east-1), AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (Ceph,
 * MinIO: path-style requests to that endpoint; without one, AWS's virtual-hosted
 * https://BUCKET.s3.REGION.amazonaws.com). Requests are signed with AWS Signature Version 4
 * (OpenSSL's SHA-256 and HMAC); without a key pair they go unsigned (public buckets).
 * HTTP is libcurl's, on the calling thread (the model manager's), with timeouts.
 *
 * Not thread-safe: one thread syncs (the manager, before each scan).
 */
#ifndef SP_SERVING_S3REPO_H
#define SP_SERVING_S3REPO_H

#include <stdbool.h>
#include <stddef.h>

#include "sampan/status.h"

typedef struct sp_s3repo sp_s3repo_t;

/* True for "s3://...". */
bool sp_s3repo_is_url(const char *url);

/* Parse url (s3://BUCKET[/PREFIX]) and the environment; the mirror goes under cache_root
 * (created; "" = $XDG_CACHE_HOME/sampan/s3, else ~/.cache/sampan/s3). local_dir receives
 * the mirror's directory, the repository root the scanner reads. No network yet. */
sp_status_t sp_s3repo_open(const char *url, const char *cache_root, sp_s3repo_t **out,
                           char *local_dir, size_t local_cap, char *err, size_t err_len);

/* Bring the mirror to the bucket's state. *changed (may be NULL) counts the files
 * downloaded or deleted. On an error the mirror keeps what it had (a failed download
 * never replaces a file); the message names the bucket, the key and the store's answer. */
sp_status_t sp_s3repo_sync(sp_s3repo_t *r, int *changed, char *err, size_t err_len);

void sp_s3repo_close(sp_s3repo_t *r);

#endif /* SP_SERVING_S3REPO_H */
