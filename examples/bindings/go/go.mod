module quota.example/quota

go 1.19
