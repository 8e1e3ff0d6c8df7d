"""The approval page (`corral console`): people approve or deny Intents from a phone browser.

It holds no Kubernetes rights of its own. A person signs in by pasting their own bearer token once; the
server checks it with a SelfSubjectReview made with that token, keeps it in memory under a random session
id (an HttpOnly, SameSite=Strict cookie) and makes every Kubernetes call for that person with it, so the
page can never do more than the person could with kubectl.

Pure parts (`sessions`, `guard`, `waiting`) are unit-tested; `people` talks to the API server, `app` serves.
"""
