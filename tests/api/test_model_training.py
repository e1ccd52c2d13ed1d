"""Training through the API: a background job on a small recording with incidents saves a new model
under the registry's root, listed with its metrics and not active until an admin activates it."""

from __future__ import annotations

from tests.api.conftest import headers
from tests.helpers import wait_until


def test_a_training_job_saves_a_new_model_that_waits_to_be_activated(client, api_ctx, small_recording):
    r = client.post("/v1/models/train", json={"recordings": [str(small_recording)], "name": "candidate", "seed": 1},
                    headers=headers("admin"))
    assert r.status_code == 202, r.text
    job = r.json()
    assert (job["kind"], job["actor"], job["params"]["name"]) == ("train", "operator:admin", "candidate")
    done = wait_until(lambda: (j := client.get(f"/v1/models/train/{job['id']}", headers=headers("viewer")).json())
                      ["state"] in ("succeeded", "failed") and j, timeout_s=240)
    assert done["state"] == "succeeded", done["error"]
    models = client.get("/v1/models", headers=headers("viewer")).json()
    assert {m["name"]: m["active"] for m in models["models"]} == {"candidate": False, "default": True}
    assert client.get("/v1/models/candidate/metrics", headers=headers("viewer")).json()["metrics"]
    again = client.post("/v1/models/train", json={"recordings": [str(small_recording)], "name": "candidate"},
                        headers=headers("admin"))
    assert again.status_code == 422 and "exists already" in again.json()["error"]["message"]
    assert client.post("/v1/models/candidate/activate", headers=headers("admin")).status_code == 200
    assert [p.name for p in api_ctx.activated] == ["candidate"]
