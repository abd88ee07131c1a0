module vk-cocoon/sim/client-go

go 1.22
